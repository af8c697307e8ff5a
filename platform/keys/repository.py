from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from loraplex.platform.keys.models import ApiKey


def get(session: Session, key_id: str) -> ApiKey | None:
    return session.get(ApiKey, key_id)


def get_by_hash(session: Session, key_hash: str) -> ApiKey | None:
    return session.scalar(select(ApiKey).where(ApiKey.key_hash == key_hash))


def list_for_tenant(session: Session, tenant_id: str) -> list[ApiKey]:
    stmt = (
        select(ApiKey)
        .where(ApiKey.tenant_id == tenant_id, ApiKey.deleted_at.is_(None))
        .order_by(ApiKey.created_at, ApiKey.id)
    )
    return list(session.scalars(stmt))


def add(session: Session, key: ApiKey) -> None:
    session.add(key)
    session.flush()
