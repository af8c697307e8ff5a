"""server_instances: each server's lease (heartbeat) on the usage ledger, so start-up recovery
closes only the running records of servers whose lease expired.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_instances",
        sa.Column("instance_id", sa.String(length=32), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("instance_id", name=op.f("pk_server_instances")),
    )
    op.create_index(op.f("ix_server_instances_heartbeat_at"), "server_instances", ["heartbeat_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_server_instances_heartbeat_at"), table_name="server_instances")
    op.drop_table("server_instances")
