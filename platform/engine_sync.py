"""Pushes what the database says into the running engine: at start (everything) and after each
committed admin change (just what changed), so the change affects the engine's next step."""
from __future__ import annotations

from sqlalchemy.orm import Session

from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.db.session import on_commit
from loraplex.platform.engine_gateway import EngineGateway
from loraplex.platform.quotas import repository as quotas_repo
from loraplex.platform.tenants import repository as tenants_repo
from loraplex.platform.tenants.models import Tenant


def push_tenant_after_commit(session: Session, gateway: EngineGateway, tenant: Tenant) -> None:
    quota = quotas_repo.get(session, tenant.id)
    args = (tenant.id, tenant.priority, tenant.weight, quota.max_concurrent if quota else None)
    on_commit(session, lambda: gateway.set_tenant(*args))


def sync_all(session: Session, gateway: EngineGateway, store_root) -> None:
    quotas = {q.tenant_id: q for q in quotas_repo.all_quotas(session)}
    for tenant in tenants_repo.all_tenants(session):
        quota = quotas.get(tenant.id)
        gateway.set_tenant(
            tenant.id, tenant.priority, tenant.weight, quota.max_concurrent if quota else None
        )
    for adapter in adapters_repo.active_adapters(session):
        gateway.add_adapter(adapter.id, store_root / adapter.storage_path)
