"""Alerts: webhooks, the transactional outbox of alert events and their deliveries (leases,
attempts, state). See docs/alerts.md.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_webhooks",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("secret", sa.String(length=256), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_alert_webhooks_tenant_id_tenants", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_webhooks"),
    )
    op.create_index("ix_alert_webhooks_tenant_id", "alert_webhooks", ["tenant_id"])
    op.create_table(
        "alert_events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("dedupe_key", sa.String(length=400), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=True),
        sa.Column("key_id", sa.String(length=40), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fanned_out", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_alert_events"),
        sa.UniqueConstraint("dedupe_key", name="uq_alert_events_dedupe_key"),
    )
    op.create_index("ix_alert_events_tenant_id", "alert_events", ["tenant_id"])
    op.create_index("ix_alert_events_created_at", "alert_events", ["created_at"])
    op.create_index("ix_alert_events_fanned_out", "alert_events", ["fanned_out"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=40), nullable=False),
        sa.Column("webhook_id", sa.String(length=40), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=500), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["event_id"], ["alert_events.id"], name="fk_alert_deliveries_event_id_alert_events", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["alert_webhooks.id"],
            name="fk_alert_deliveries_webhook_id_alert_webhooks",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_deliveries"),
        sa.UniqueConstraint("event_id", "webhook_id", name="uq_alert_deliveries_event_webhook"),
    )
    op.create_index("ix_alert_deliveries_due", "alert_deliveries", ["state", "next_attempt_at"])
    op.create_index("ix_alert_deliveries_webhook_id", "alert_deliveries", ["webhook_id"])


def downgrade() -> None:
    op.drop_table("alert_deliveries")
    op.drop_table("alert_events")
    op.drop_table("alert_webhooks")
