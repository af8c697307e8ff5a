"""The price book (``prices``: rates per million tokens by model, rows never rewritten) and what a
usage record needs to be priced: ``cached_tokens`` (prompt tokens served from the prefix cache, 0
for existing rows) and ``base_model`` (the base model that served it, NULL for existing rows: they
are priced by their adapter's price or the "*" price). Costs are computed at read time, so no
existing row is rewritten.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "prices",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("input_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("output_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
        sa.UniqueConstraint("model", "effective_from", name="uq_prices_model_effective_from"),
    )
    op.create_index(op.f("ix_prices_model"), "prices", ["model"], unique=False)
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("cached_tokens", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("base_model", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("base_model")
        batch.drop_column("cached_tokens")
    op.drop_index(op.f("ix_prices_model"), table_name="prices")
    op.drop_table("prices")
