"""Stored responses (``store: true``): one row per response, always read and deleted through the
caller's key, so a tenant never sees another's (an id of someone else's reads as absent: 404).

Who sees what (docs/openai-api.md): a key without a model scope sees every stored response of its
tenant (OpenAI's project-wide store); a key limited to some models sees only the responses it
created itself, and of those only the ones whose model is still in its scope. A response older than
the retention reads as absent and is deleted by ``sweep``. Per tenant, the responses not yet expired
are bounded in number and bytes (``Limits``): a request that would store past a cap is refused
before it generates, and one that gets past it in a race is delivered unstored (``store: false``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Index, Integer, String, Text, delete, func, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.db.base import Base, UTCDateTime, utcnow


class StoredResponse(Base):
    """No foreign key: a deleted tenant's rows are deleted with it (``tenants/offboarding.py``)."""

    __tablename__ = "stored_responses"
    __table_args__ = (Index("ix_stored_responses_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(32))
    # The key that created it and the model it used: a scoped key's view (NULL: stored before
    # migration 0008, visible to the tenant's unscoped keys only).
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    # The conversation a follow-up continues from (chat messages, without instructions) and the
    # Response object as returned.
    conversation: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(Integer, default=0)  # UTF-8 bytes of both texts
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


@dataclass(frozen=True)
class Limits:
    retention: timedelta
    max_count: int
    max_bytes: int

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        r = settings.responses
        return cls(timedelta(days=r.retention_days), r.max_stored_per_tenant, r.max_stored_bytes_per_tenant)

    def cutoff(self) -> datetime:
        """Rows created at or before this have expired."""
        return utcnow() - self.retention


def _visible(auth: TenantAuth, cutoff: datetime) -> list[ColumnElement[bool]]:
    conds = [StoredResponse.tenant_id == auth.tenant_id, StoredResponse.created_at > cutoff]
    if auth.allowed_models is not None:
        conds += [StoredResponse.key_id == auth.key_id, StoredResponse.model.in_(auth.allowed_models)]
    return conds


def _impossible_id(response_id: str) -> bool:
    """An id no response can have: PostgreSQL refuses a NUL in a query parameter (a 400 about the
    database), SQLite searches for it (a 404); both now answer 404 without asking."""
    return "\x00" in response_id


def get(session: Session, auth: TenantAuth, response_id: str, limits: Limits) -> StoredResponse | None:
    if _impossible_id(response_id):
        return None
    return session.scalars(
        select(StoredResponse).where(StoredResponse.id == response_id, *_visible(auth, limits.cutoff()))
    ).first()


def remove(session: Session, auth: TenantAuth, response_id: str, limits: Limits) -> bool:
    if _impossible_id(response_id):
        return False
    result = session.execute(
        delete(StoredResponse).where(StoredResponse.id == response_id, *_visible(auth, limits.cutoff()))
    )
    return bool(getattr(result, "rowcount", 0))


def usage(session: Session, tenant_id: str, cutoff: datetime) -> tuple[int, int]:
    """(responses, bytes) a tenant stores that have not expired."""
    count, size = session.execute(
        select(func.count(), func.coalesce(func.sum(StoredResponse.size_bytes), 0)).where(
            StoredResponse.tenant_id == tenant_id, StoredResponse.created_at > cutoff
        )
    ).one()
    return int(count), int(size)


def over_limits(session: Session, tenant_id: str, limits: Limits, adding_bytes: int = 0) -> str | None:
    """Why one more response (of ``adding_bytes``) may not be stored now, or None."""
    count, size = usage(session, tenant_id, limits.cutoff())
    if count + 1 > limits.max_count:
        return f"this tenant stores {count} responses, its limit is {limits.max_count}"
    if size + max(adding_bytes, 1) > limits.max_bytes:
        return f"this tenant's stored responses take {size} bytes, its limit is {limits.max_bytes}"
    return None


def put(
    session: Session,
    auth: TenantAuth,
    response: dict[str, Any],
    conversation: list[dict[str, Any]],
    limits: Limits,
) -> bool:
    """Store it unless that would pass a cap (False). The tenant is locked for the check and the
    insert (two servers, or two requests, cannot both take the last place)."""
    conv = json.dumps(conversation, ensure_ascii=False)
    body = json.dumps(response, ensure_ascii=False)
    size = len(conv.encode()) + len(body.encode())
    _lock_tenant(session, auth.tenant_id)
    if over_limits(session, auth.tenant_id, limits, size) is not None:
        return False
    session.add(
        StoredResponse(
            id=response["id"],
            tenant_id=auth.tenant_id,
            key_id=auth.key_id,
            model=response.get("model"),
            conversation=conv,
            body=body,
            size_bytes=size,
        )
    )
    return True


def remove_tenant(session: Session, tenant_id: str) -> int:
    """A deleted tenant's stored responses go with it (they are its users' conversations)."""
    result = session.execute(delete(StoredResponse).where(StoredResponse.tenant_id == tenant_id))
    return int(getattr(result, "rowcount", 0) or 0)


def sweep(session: Session, cutoff: datetime, batch: int = 1000) -> int:
    """Delete up to ``batch`` expired responses (the caller repeats while it gets a full batch)."""
    ids = select(StoredResponse.id).where(StoredResponse.created_at <= cutoff).limit(batch).scalar_subquery()
    result = session.execute(delete(StoredResponse).where(StoredResponse.id.in_(ids)))
    return int(getattr(result, "rowcount", 0) or 0)


def _lock_tenant(session: Session, tenant_id: str) -> None:
    """PostgreSQL: a transaction-scoped advisory lock on the tenant; SQLite: the file's write lock,
    taken by a write that changes nothing (held to the commit, like ``quotas/shared.py``)."""
    if session.get_bind().dialect.name == "postgresql":
        key = int.from_bytes(
            hashlib.blake2b(f"loraplex-responses:{tenant_id}".encode(), digest_size=8).digest(), "big", signed=True
        )
        session.execute(select(func.pg_advisory_xact_lock(key)))
    else:
        session.execute(
            update(StoredResponse).where(StoredResponse.id == "").values(tenant_id=StoredResponse.tenant_id)
        )
