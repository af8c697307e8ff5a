"""The outbox (``alert_events``), the receivers (``alert_webhooks``) and one delivery row per event
and receiver (``alert_deliveries``) carrying its state, attempts and lease."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, utcnow

PENDING, DELIVERED, DEAD = "pending", "delivered", "dead"


class AlertWebhook(Base):
    __tablename__ = "alert_webhooks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    url: Mapped[str] = mapped_column(String(2048))
    # The HMAC key. It must be readable to sign, so it is stored as given (like Stripe's endpoint
    # secrets); the API never returns it (docs/alerts.md).
    secret: Mapped[str] = mapped_column(String(256))
    events: Mapped[list] = mapped_column(JSON, default=list)  # kinds to receive; empty = all
    tenant_id: Mapped[str | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True, index=True
    )  # only this tenant's events; NULL = every tenant's
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AlertEventRow(Base):
    __tablename__ = "alert_events"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # the webhook-id header
    kind: Mapped[str] = mapped_column(String(64))
    dedupe_key: Mapped[str] = mapped_column(String(400), unique=True)
    tenant_id: Mapped[str | None] = mapped_column(String(40), nullable=True, index=True)
    key_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    body: Mapped[str] = mapped_column(Text)  # the exact bytes delivered (and signed)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    # Deliveries were created for the webhooks matching at that moment (dispatcher.fan_out).
    fanned_out: Mapped[bool] = mapped_column(Boolean, default=False, index=True)


class AlertDelivery(Base):
    __tablename__ = "alert_deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "webhook_id", name="uq_alert_deliveries_event_webhook"),
        Index("ix_alert_deliveries_due", "state", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("alert_events.id", ondelete="CASCADE"))
    webhook_id: Mapped[str] = mapped_column(ForeignKey("alert_webhooks.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16), default=PENDING)  # pending | delivered | dead
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # A claim: this server delivers the row until the lease expires (then anyone may again).
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(500), nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
