from __future__ import annotations

from loraplex.platform.quotas.models import Quota
from sqlalchemy import select
from sqlalchemy.orm import Session


def get(session: Session, tenant_id: str) -> Quota | None:
    return session.get(Quota, tenant_id)


def all_quotas(session: Session) -> list[Quota]:
    return list(session.scalars(select(Quota)))


def add(session: Session, quota: Quota) -> None:
    session.add(quota)
    session.flush()
