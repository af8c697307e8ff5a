"""Billing-grade ledger: usage_records keyed by request id (unique), no foreign keys, running /
final statuses; soft deletes for tenants, keys and adapters; adapter status reasons; a per-tenant
generation timeout.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_USAGE_FKS = (
    ("fk_usage_records_tenant_id_tenants", "tenants", "tenant_id", "CASCADE"),
    ("fk_usage_records_api_key_id_api_keys", "api_keys", "api_key_id", "SET NULL"),
    ("fk_usage_records_adapter_id_adapters", "adapters", "adapter_id", "SET NULL"),
)


def upgrade() -> None:
    # Older rows may lack a request id; give them a unique one before the constraint.
    op.execute(
        "UPDATE usage_records SET request_id = 'legacy-' || CAST(id AS VARCHAR(20)) "
        "WHERE request_id = '' OR request_id IS NULL"
    )
    with op.batch_alter_table("usage_records") as batch:
        for name, _table, _col, _ondelete in _USAGE_FKS:
            batch.drop_constraint(name, type_="foreignkey")
        batch.add_column(sa.Column("instance_id", sa.String(length=32), nullable=False, server_default=""))
        batch.add_column(sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE usage_records SET updated_at = created_at")
    with op.batch_alter_table("usage_records") as batch:
        batch.alter_column("updated_at", existing_type=sa.DateTime(timezone=True), nullable=False)
        batch.alter_column("instance_id", existing_type=sa.String(length=32), server_default=None)
        batch.create_unique_constraint(batch.f("uq_usage_records_request_id"), ["request_id"])
        batch.create_index(batch.f("ix_usage_records_status"), ["status"], unique=False)
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("adapters") as batch:
        batch.add_column(sa.Column("status_reason", sa.String(length=512), nullable=True))
        batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("quotas") as batch:
        batch.add_column(sa.Column("max_generation_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        batch.drop_column("max_generation_s")
    with op.batch_alter_table("adapters") as batch:
        batch.drop_column("deleted_at")
        batch.drop_column("status_reason")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("deleted_at")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("deleted_at")
    # Rows whose tenant/key/adapter rows are gone cannot take the foreign keys back.
    op.execute("DELETE FROM usage_records WHERE tenant_id NOT IN (SELECT id FROM tenants)")
    op.execute("UPDATE usage_records SET api_key_id = NULL WHERE api_key_id NOT IN (SELECT id FROM api_keys)")
    op.execute("UPDATE usage_records SET adapter_id = NULL WHERE adapter_id NOT IN (SELECT id FROM adapters)")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_index(batch.f("ix_usage_records_status"))
        batch.drop_constraint(batch.f("uq_usage_records_request_id"), type_="unique")
        batch.drop_column("updated_at")
        batch.drop_column("instance_id")
        for name, table, col, ondelete in _USAGE_FKS:
            batch.create_foreign_key(name, table, [col], ["id"], ondelete=ondelete)
