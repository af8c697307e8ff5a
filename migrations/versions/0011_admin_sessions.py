"""admin_sessions: signed-in admin page users (SSO; only the SHA-256 of the cookie token is kept),
and audit_log.actor widened to 255 characters for "sso:<email>" actors. Existing rows are kept.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "admin_sessions",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("email", sa.String(length=255), nullable=False),
        sa.Column("roles", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_admin_sessions")),
    )
    op.create_index(op.f("ix_admin_sessions_email"), "admin_sessions", ["email"], unique=False)
    op.create_index(op.f("ix_admin_sessions_expires_at"), "admin_sessions", ["expires_at"], unique=False)
    with op.batch_alter_table("audit_log") as batch:
        batch.alter_column("actor", existing_type=sa.String(length=64), type_=sa.String(length=255))


def downgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.alter_column("actor", existing_type=sa.String(length=255), type_=sa.String(length=64))
    op.drop_index(op.f("ix_admin_sessions_expires_at"), table_name="admin_sessions")
    op.drop_index(op.f("ix_admin_sessions_email"), table_name="admin_sessions")
    op.drop_table("admin_sessions")
