from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from loraplex.platform.audit import service as audit
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.session import on_commit
from loraplex.platform.db.snapshot import snapshot
from loraplex.platform.errors import Conflict, NotFound
from loraplex.platform.tenants import repository
from loraplex.platform.tenants.models import Tenant


def get_tenant(session: Session, tenant_id: str) -> Tenant:
    tenant = repository.get(session, tenant_id)
    if tenant is None:
        raise NotFound(f"no tenant with id {tenant_id!r}", param="tenant_id")
    return tenant


def create_tenant(
    session: Session, ctx, actor: Actor, *, name: str, priority: int = 0, weight: float = 1.0,
    status: str = "active",
) -> Tenant:
    if repository.get_by_name(session, name) is not None:
        raise Conflict(f"a tenant named {name!r} already exists", param="name")
    tenant = Tenant(name=name, priority=priority, weight=weight, status=status)
    repository.add(session, tenant)
    audit.record(session, actor.name, "tenant.create", "tenant", tenant.id, None, snapshot(tenant))
    _after_change(session, ctx, tenant)
    return tenant


def list_tenants(session: Session, *, limit: int, offset: int) -> tuple[list[Tenant], int]:
    return repository.list_tenants(session, limit=limit, offset=offset)


def update_tenant(session: Session, ctx, actor: Actor, tenant_id: str, changes: dict[str, Any]) -> Tenant:
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
    return tenant


def delete_tenant(session: Session, ctx, actor: Actor, tenant_id: str) -> None:
    from loraplex.platform.adapters import service as adapters_service

    tenant = get_tenant(session, tenant_id)
    before = snapshot(tenant)
    for adapter in adapters_service.owned_by(session, tenant_id):
        adapters_service.delete_adapter(session, ctx, actor, adapter.id)
    repository.delete(session, tenant)
    audit.record(session, actor.name, "tenant.delete", "tenant", tenant_id, before, None)
    ctx.key_cache.evict_tenant(tenant_id)
    on_commit(session, lambda: ctx.key_cache.evict_tenant(tenant_id))


def _after_change(session: Session, ctx, tenant: Tenant) -> None:
    from loraplex.platform.engine_sync import push_tenant_after_commit

    tenant_id = tenant.id
    ctx.key_cache.evict_tenant(tenant_id)
    on_commit(session, lambda: ctx.key_cache.evict_tenant(tenant_id))
    push_tenant_after_commit(session, ctx.gateway, tenant)
