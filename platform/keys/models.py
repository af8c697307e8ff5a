from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, new_id, utcnow


class ApiKey(Base):
    """A tenant's API key. Only the prefix (for people) and an HMAC of the full key are stored."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("key"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64), default="")
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Scopes: the models (base model or adapter names) this key may use (None = all its tenant may
    # use), and limits of its own on top of its tenant's (None = only the tenant's apply).
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The key's project (platform/projects/): its limits and allowlist apply on top of the tenant's.
    project_id: Mapped[str | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), nullable=True, index=True
    )
    # Soft delete (with its tenant): the row stays so usage records still name the key.
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class AdminKey(Base):
    """A generated admin key (first start without LORAPLEX_ADMIN_KEY): hash only."""

    __tablename__ = "admin_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("adm"))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
