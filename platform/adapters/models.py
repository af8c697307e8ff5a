from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, new_id, utcnow


class Adapter(Base):
    """One uploaded version of a LoRA adapter. A new upload under the same name is a new row
    (version + 1) with its own id, and the engine knows it under that id, so KV cached for an older
    version can never be served for a newer one."""

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_adapters_name_version"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("ada"))
    name: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    visibility: Mapped[str] = mapped_column(String(16), default="private")
    owner_tenant_id: Mapped[str | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), nullable=True, index=True
    )
    base_model: Mapped[str] = mapped_column(String(255), default="")
    rank: Mapped[int] = mapped_column(Integer)
    alpha: Mapped[float] = mapped_column(Float)
    target_modules: Mapped[list[str]] = mapped_column(JSON, default=list)
    use_rslora: Mapped[bool] = mapped_column(Boolean, default=False)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int] = mapped_column(Integer, default=0)
    storage_path: Mapped[str] = mapped_column(String(512))  # "" for an adapter registered by reference
    # Registered by reference (s3://, file://, hf://): fetched on first use into each engine's disk
    # cache; sha256 pins the content of this version and source_etag the store's change tags.
    source_uri: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    source_etag: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # "active": served under its name; "superseded": an older version, kept for the record only;
    # "unavailable": active but its files are missing or unreadable (status_reason says why);
    # "deleted": soft-deleted, hidden from the APIs, kept so usage history still names it.
    status: Mapped[str] = mapped_column(String(16), default="active")
    status_reason: Mapped[str | None] = mapped_column(String(512), nullable=True)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AdapterGrant(Base):
    """Lets a tenant other than the owner use a private adapter."""

    __tablename__ = "adapter_grants"

    adapter_id: Mapped[str] = mapped_column(ForeignKey("adapters.id", ondelete="CASCADE"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
