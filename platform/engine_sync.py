"""Pushes what the database says into the running engine: at start (everything) and after each
committed admin change (just what changed), so the change affects the engine's next step."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.orm import Session

from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.db.session import on_commit
from loraplex.platform.engine_client import EngineClient
from loraplex.platform.quotas import repository as quotas_repo
from loraplex.platform.tenants import repository as tenants_repo
from loraplex.platform.tenants.models import Tenant

log = logging.getLogger("loraplex.platform.engine")


def push_tenant_after_commit(session: Session, engine: EngineClient, tenant: Tenant) -> None:
    quota = quotas_repo.get(session, tenant.id)
    args = (tenant.id, tenant.priority, tenant.weight, quota.max_concurrent if quota else None)
    on_commit(session, lambda: engine.set_tenant(*args))


def sync_all(session: Session, engine: EngineClient, store_root: Path) -> None:
    """Everything into the engine. An adapter that cannot be loaded (files missing or unreadable)
    is marked ``unavailable`` with the reason instead of stopping the server; one that loads again
    becomes ``active`` again."""
    quotas = {q.tenant_id: q for q in quotas_repo.all_quotas(session)}
    for tenant in tenants_repo.all_tenants(session):
        if tenant.status == "deleted":
            continue
        quota = quotas.get(tenant.id)
        engine.set_tenant(tenant.id, tenant.priority, tenant.weight, quota.max_concurrent if quota else None)
    for adapter in adapters_repo.served_adapters(session):
        if adapter.source_uri:
            continue  # by reference: fetched and registered on first use (platform/adapters/sources)
        path = store_root / adapter.storage_path
        try:
            if not (path / "adapter_config.json").is_file():
                raise FileNotFoundError(f"adapter files missing at {path}")
            engine.add_adapter(adapter.id, path)
        except Exception as exc:  # noqa: BLE001 - any reason to not serve it is reported, not fatal
            reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            if adapter.status != "unavailable" or adapter.status_reason != reason[:512]:
                log.error("adapter %s (%s) is unavailable: %s", adapter.name, adapter.id, reason)
            adapter.status, adapter.status_reason = "unavailable", reason[:512]
        else:
            if adapter.status == "unavailable":
                log.info("adapter %s (%s) is available again", adapter.name, adapter.id)
            adapter.status, adapter.status_reason = "active", None
    session.flush()
