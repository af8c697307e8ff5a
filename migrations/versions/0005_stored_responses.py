"""stored_responses: the Responses API's stored responses (per tenant; no foreign keys).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("conversation", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stored_responses")),
    )
    with op.batch_alter_table("stored_responses") as batch:
        batch.create_index(batch.f("ix_stored_responses_tenant_id"), ["tenant_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("stored_responses") as batch:
        batch.drop_index(batch.f("ix_stored_responses_tenant_id"))
    op.drop_table("stored_responses")
