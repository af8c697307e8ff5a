"""Adapters by reference (adapters.source_uri / source_etag) and per-key scopes (api_keys.allowed_models,
rpm, tpm, max_concurrent).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("adapters") as batch:
        batch.add_column(sa.Column("source_uri", sa.String(length=1024), nullable=True))
        batch.add_column(sa.Column("source_etag", sa.String(length=64), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("allowed_models", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("rpm", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("tpm", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_concurrent", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        for name in ("max_concurrent", "tpm", "rpm", "allowed_models"):
            batch.drop_column(name)
    with op.batch_alter_table("adapters") as batch:
        batch.drop_column("source_etag")
        batch.drop_column("source_uri")
