from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, utcnow

# A record is "running" while its request streams (checkpointed every few seconds) and takes one
# final status when it ends; "interrupted" = the server died while it ran (closed at the next start).
FINAL_STATUSES = ("ok", "aborted", "error", "timeout", "interrupted")


class UsageRecord(Base):
    """One billed request. No foreign keys on purpose: usage is history, and a record must never
    be refused (or cascade-deleted) because its tenant, key or adapter changed meanwhile; those rows
    are soft-deleted instead, so the ids still resolve."""

    __tablename__ = "usage_records"
    # Quota windows shared by servers on one database read a tenant's last minute / budget period.
    __table_args__ = (Index("ix_usage_records_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    # Idempotency key: a replayed or re-sent record updates its row, never adds a second one.
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    # The x-request-id of the HTTP request (the client's own, or one the server made): what a
    # client quotes to support. One HTTP request may be several records (a list of prompts).
    http_request_id: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    tenant_id: Mapped[str] = mapped_column(String(32), index=True)
    api_key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    project_id: Mapped[str | None] = mapped_column(String(32), nullable=True)  # the key's project then
    adapter_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    adapter_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    endpoint: Mapped[str] = mapped_column(String(32), default="")
    user: Mapped[str | None] = mapped_column(String(256), nullable=True)  # the OpenAI ``user`` field
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # Prompt tokens the engine served from its prefix cache (priced at the cached input rate).
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The base model that served it (an adapter's price falls back to its base model's).
    base_model: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # What admission reserved (prompt + n x max_tokens): another server counts a running request
    # of this one at this much until it ends (quotas shared through the ledger).
    reserved_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="ok", index=True)
    # The server process that wrote it (a restart closes other processes' running records).
    instance_id: Mapped[str] = mapped_column(String(32), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ServerInstance(Base):
    """A server's lease on the ledger: while its heartbeat is fresh, no other server's start-up
    recovery may close its running records (a rolling restart, two servers side by side)."""

    __tablename__ = "server_instances"

    instance_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
