from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from loraplex.platform.tenants.models import Tenant


def get(session: Session, tenant_id: str) -> Tenant | None:
    return session.get(Tenant, tenant_id)


def get_by_name(session: Session, name: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.name == name))


def list_tenants(session: Session, *, limit: int, offset: int) -> tuple[list[Tenant], int]:
    live = Tenant.status != "deleted"
    rows = session.scalars(
        select(Tenant).where(live).order_by(Tenant.created_at, Tenant.id).limit(limit).offset(offset)
    )
    total = session.scalar(select(func.count()).select_from(Tenant).where(live)) or 0
    return list(rows), total


def all_tenants(session: Session) -> list[Tenant]:
    return list(session.scalars(select(Tenant)))


def add(session: Session, tenant: Tenant) -> None:
    session.add(tenant)
    session.flush()
