from __future__ import annotations

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from loraplex.platform.adapters.models import Adapter, AdapterGrant


def get(session: Session, adapter_id: str) -> Adapter | None:
    return session.get(Adapter, adapter_id)


def versions(session: Session, name: str) -> list[Adapter]:
    """Every version of ``name``, deleted ones too (version numbers are never reused)."""
    stmt = select(Adapter).where(Adapter.name == name).order_by(Adapter.version)
    return list(session.scalars(stmt))


# Versions that hold the name: "active" ones are served, "unavailable" ones answer 503 with the reason.
SERVED = ("active", "unavailable")
# Versions the admin API still shows ("deleted" ones are kept only as history).
LISTED = ("active", "unavailable", "superseded")


def active_by_name(session: Session, name: str) -> Adapter | None:
    stmt = select(Adapter).where(Adapter.name == name, Adapter.status.in_(SERVED))
    return session.scalar(stmt.order_by(Adapter.version.desc()).limit(1))


def list_adapters(session: Session, *, tenant_id: str | None, include_superseded: bool) -> list[Adapter]:
    stmt = select(Adapter).order_by(Adapter.name, Adapter.version)
    stmt = stmt.where(Adapter.status.in_(LISTED if include_superseded else SERVED))
    if tenant_id is not None:
        stmt = stmt.where(or_(*usable_clause(tenant_id)))
    return list(session.scalars(stmt))


def usable_clause(tenant_id: str):
    granted = select(AdapterGrant.adapter_id).where(AdapterGrant.tenant_id == tenant_id)
    return (
        Adapter.visibility == "shared",
        Adapter.owner_tenant_id == tenant_id,
        Adapter.id.in_(granted),
    )


def is_usable_by(session: Session, adapter: Adapter, tenant_id: str) -> bool:
    if adapter.visibility == "shared" or adapter.owner_tenant_id == tenant_id:
        return True
    return get_grant(session, adapter.id, tenant_id) is not None


def owned_by(session: Session, tenant_id: str) -> list[Adapter]:
    stmt = select(Adapter).where(Adapter.owner_tenant_id == tenant_id, Adapter.status != "deleted")
    return list(session.scalars(stmt))


def served_adapters(session: Session) -> list[Adapter]:
    return list(session.scalars(select(Adapter).where(Adapter.status.in_(SERVED))))


def stored_paths_in_use(session: Session) -> set[str]:
    """Store folders some non-deleted adapter row points at."""
    stmt = select(Adapter.storage_path).where(Adapter.status != "deleted")
    return set(session.scalars(stmt))


def count_with_sha(session: Session, sha256: str, exclude_id: str) -> int:
    stmt = (
        select(func.count())
        .select_from(Adapter)
        .where(Adapter.sha256 == sha256, Adapter.id != exclude_id, Adapter.status != "deleted")
    )
    return session.scalar(stmt) or 0


def grants(session: Session, adapter_id: str) -> list[AdapterGrant]:
    stmt = select(AdapterGrant).where(AdapterGrant.adapter_id == adapter_id).order_by(AdapterGrant.created_at)
    return list(session.scalars(stmt))


def grants_of_tenant(session: Session, tenant_id: str) -> list[AdapterGrant]:
    return list(session.scalars(select(AdapterGrant).where(AdapterGrant.tenant_id == tenant_id)))


def granted_tenant_ids(session: Session, adapter_ids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {a: [] for a in adapter_ids}
    if adapter_ids:
        stmt = select(AdapterGrant).where(AdapterGrant.adapter_id.in_(adapter_ids))
        for g in session.scalars(stmt):
            out[g.adapter_id].append(g.tenant_id)
    return out


def get_grant(session: Session, adapter_id: str, tenant_id: str) -> AdapterGrant | None:
    return session.get(AdapterGrant, (adapter_id, tenant_id))


def add(session: Session, obj: Adapter | AdapterGrant) -> None:
    session.add(obj)
    session.flush()


def delete(session: Session, obj: Adapter | AdapterGrant) -> None:
    session.delete(obj)
    session.flush()
