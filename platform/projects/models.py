from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from loraplex.platform.db.base import Base, UTCDateTime, new_id, utcnow


class Project(Base):
    """A level between a tenant and its keys (a customer's team): limits of its own on top of the
    tenant's, a model allowlist that narrows the tenant's, and a priority and fair-share weight
    inside the tenant's share. Archived, never deleted: usage records keep naming it."""

    __tablename__ = "projects"
    # Unique per tenant, archived projects included: a usage report by project stays unambiguous.
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_projects_tenant_id_name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("prj"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    # None: only the tenant's (and the key's) limits apply.
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The models its keys may use, inside the tenant's (None: everything the tenant may use).
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # Inside the tenant's share: lower priority runs first, then the weights split the share.
    priority: Mapped[int] = mapped_column(Integer, default=0)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    archived_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    @property
    def status(self) -> str:
        return "archived" if self.archived_at is not None else "active"
