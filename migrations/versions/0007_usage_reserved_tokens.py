"""usage_records.reserved_tokens (what admission reserved: prompt + n x max_tokens) and an index on
(tenant_id, created_at): servers on one database count each other's admissions of the last minute
and of the budget period from the ledger (quota windows shared through the database).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("reserved_tokens", sa.Integer(), nullable=False, server_default="0"))
        batch.create_index("ix_usage_records_tenant_created", ["tenant_id", "created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_index("ix_usage_records_tenant_created")
        batch.drop_column("reserved_tokens")
