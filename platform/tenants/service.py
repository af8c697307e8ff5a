from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import on_commit
from loraplex.platform.db.snapshot import snapshot
from loraplex.platform.errors import Conflict, NotFound
from loraplex.platform.tenants import repository
from loraplex.platform.tenants.models import Tenant

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext


def get_tenant(session: Session, tenant_id: str, *, include_deleted: bool = False) -> Tenant:
    tenant = repository.get(session, tenant_id)
    if tenant is None or (tenant.status == "deleted" and not include_deleted):
        raise NotFound(f"no tenant with id {tenant_id!r}", param="tenant_id")
    return tenant


def create_tenant(
    session: Session,
    ctx: PlatformContext,
    actor: Actor,
    *,
    name: str,
    priority: int = 0,
    weight: float = 1.0,
    status: str = "active",
) -> Tenant:
    existing = repository.get_by_name(session, name)
    if existing is not None:
        # Deleted tenants keep their names: usage reports must stay unambiguous.
        note = " (deleted; its name stays reserved for its usage history)" if existing.status == "deleted" else ""
        raise Conflict(f"a tenant named {name!r} already exists{note}", param="name")
    tenant = Tenant(name=name, priority=priority, weight=weight, status=status)
    repository.add(session, tenant)
    audit.record(session, actor.name, "tenant.create", "tenant", tenant.id, None, snapshot(tenant))
    _after_change(session, ctx, tenant)
    return tenant


def list_tenants(session: Session, *, limit: int, offset: int) -> tuple[list[Tenant], int]:
    return repository.list_tenants(session, limit=limit, offset=offset)


def update_tenant(
    session: Session, ctx: PlatformContext, actor: Actor, tenant_id: str, changes: dict[str, Any]
) -> Tenant:
    tenant = get_tenant(session, tenant_id)
    new_name = changes.get("name")
    if new_name and new_name != tenant.name and repository.get_by_name(session, new_name):
        raise Conflict(f"a tenant named {new_name!r} already exists", param="name")
    before = snapshot(tenant)
    for field, value in changes.items():
        setattr(tenant, field, value)
    session.flush()
    audit.record(session, actor.name, "tenant.update", "tenant", tenant.id, before, snapshot(tenant))
    _after_change(session, ctx, tenant)
    if tenant.status != "active":
        _abort_after_commit(session, ctx, tenant_id, f"tenant {tenant_id} is {tenant.status}")
    return tenant


def mark_deleted(session: Session, ctx: PlatformContext, actor: Actor, tenant: Tenant) -> None:
    """The tenant's own part of its deletion (``offboarding.delete_tenant`` is the whole use case):
    the row stays as history, keys resolving to it stop working, its in-flight requests stop."""
    before = snapshot(tenant)
    tenant.status, tenant.deleted_at = "deleted", utcnow()
    session.flush()
    audit.record(session, actor.name, "tenant.delete", "tenant", tenant.id, before, snapshot(tenant))
    tenant_id = tenant.id
    ctx.key_cache.evict_tenant(tenant_id)
    on_commit(session, lambda: ctx.key_cache.evict_tenant(tenant_id))
    _abort_after_commit(session, ctx, tenant_id, f"tenant {tenant_id} was deleted")


def _abort_after_commit(session: Session, ctx: PlatformContext, tenant_id: str, reason: str) -> None:
    on_commit(session, lambda: ctx.inflight.abort(ctx.engine, reason, tenant_id=tenant_id))


def _after_change(session: Session, ctx: PlatformContext, tenant: Tenant) -> None:
    from loraplex.platform.engine_sync import push_tenant_after_commit

    tenant_id = tenant.id
    ctx.key_cache.evict_tenant(tenant_id)
    on_commit(session, lambda: ctx.key_cache.evict_tenant(tenant_id))
    push_tenant_after_commit(session, ctx.engine, tenant)
