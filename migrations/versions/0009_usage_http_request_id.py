"""usage_records.http_request_id: the x-request-id of the HTTP request a record belongs to (the
client's valid one, or one the server made), indexed so support can find a client's request.
Existing rows have none (NULL).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("http_request_id", sa.String(length=128), nullable=True))
        batch.create_index("ix_usage_records_http_request_id", ["http_request_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_index("ix_usage_records_http_request_id")
        batch.drop_column("http_request_id")
