"""stored_responses: key_id and model (a scoped key sees only its own responses of its models),
size_bytes (per-tenant byte cap), an index on (tenant_id, created_at) for the caps and the expiry
sweep (replacing the tenant_id index). Existing rows get their size and model from their texts;
their key is unknown (NULL: visible to the tenant's unscoped keys only). Stored responses of
tenants deleted before this revision are deleted, as offboarding now does.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stored_responses") as batch:
        batch.add_column(sa.Column("key_id", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("model", sa.String(length=256), nullable=True))
        batch.add_column(sa.Column("size_bytes", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_index(batch.f("ix_stored_responses_tenant_id"))
        batch.create_index("ix_stored_responses_tenant_created", ["tenant_id", "created_at"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "UPDATE stored_responses SET size_bytes = octet_length(conversation) + octet_length(body), "
            "model = left(body::json->>'model', 256)"
        )
    else:
        op.execute(
            "UPDATE stored_responses SET size_bytes = length(CAST(conversation AS BLOB)) + length(CAST(body AS BLOB)), "
            "model = substr(json_extract(body, '$.model'), 1, 256)"
        )
    op.execute("DELETE FROM stored_responses WHERE tenant_id IN (SELECT id FROM tenants WHERE status = 'deleted')")


def downgrade() -> None:
    with op.batch_alter_table("stored_responses") as batch:
        batch.drop_index("ix_stored_responses_tenant_created")
        batch.create_index(batch.f("ix_stored_responses_tenant_id"), ["tenant_id"], unique=False)
        batch.drop_column("size_bytes")
        batch.drop_column("model")
        batch.drop_column("key_id")
