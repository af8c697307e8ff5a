from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, utcnow


class AdminSession(Base):
    """A signed-in admin page user. Only the SHA-256 of the cookie's token is kept: a copy of the
    database does not let anybody act as the user."""

    __tablename__ = "admin_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255))  # the provider's `sub`
    email: Mapped[str] = mapped_column(String(255), index=True)
    roles: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
