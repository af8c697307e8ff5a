from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from loraplex.platform.quotas.models import Quota


def get(session: Session, tenant_id: str) -> Quota | None:
    return session.get(Quota, tenant_id)


def all_quotas(session: Session) -> list[Quota]:
    return list(session.scalars(select(Quota)))


def add(session: Session, quota: Quota) -> None:
    session.add(quota)
    session.flush()
