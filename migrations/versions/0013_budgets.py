"""Budgets in currency (``budgets``: a cap per tenant, project or key, period and timezone, with the
current window's spent and reserved amounts) and their holds (``budget_holds``: one row per admitted
request and budget until it settles). New tables only: nothing existing is rewritten.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("scope", sa.String(length=8), nullable=False),
        sa.Column("scope_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spent_units", sa.BigInteger(), nullable=False),
        sa.Column("reserved_units", sa.BigInteger(), nullable=False),
        sa.Column("updated_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", "scope_id", name=op.f("pk_budgets")),
    )
    op.create_index(op.f("ix_budgets_tenant_id"), "budgets", ["tenant_id"], unique=False)
    op.create_table(
        "budget_holds",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=8), nullable=False),
        sa.Column("scope_id", sa.String(length=40), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("amount_units", sa.BigInteger(), nullable=False),
        sa.Column("input_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("output_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("instance_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "scope", "scope_id", name=op.f("pk_budget_holds")),
    )
    op.create_index("ix_budget_holds_scope", "budget_holds", ["scope", "scope_id"], unique=False)
    op.create_index(op.f("ix_budget_holds_instance_id"), "budget_holds", ["instance_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_budget_holds_instance_id"), table_name="budget_holds")
    op.drop_index("ix_budget_holds_scope", table_name="budget_holds")
    op.drop_table("budget_holds")
    op.drop_index(op.f("ix_budgets_tenant_id"), table_name="budgets")
    op.drop_table("budgets")
