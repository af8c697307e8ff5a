"""Tenant-side model resolution: the OpenAI ``model`` field names the base model or an adapter
the tenant may use, and the API key's scope allows (``resolve_model``: the database only). An
adapter registered by reference is fetched and registered with the engine on its first use
(``serve_model``, after the session is closed; 503 ``model_unavailable`` if it cannot be)."""

from __future__ import annotations

import asyncio

from sqlalchemy.orm import Session

from loraplex.platform.adapters import references
from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.adapters.models import Adapter
from loraplex.platform.adapters.sources.serving import ModelUnavailable
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.auth.key_scopes import check_model_allowed, model_allowed
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.errors import NotFound, ServiceUnavailable
from loraplex.platform.inference.schemas import ModelCard


def _tenant_of(tenant: TenantAuth | str) -> tuple[str, TenantAuth | None]:
    return (tenant.tenant_id, tenant) if isinstance(tenant, TenantAuth) else (tenant, None)


def list_models(session: Session, ctx, tenant: TenantAuth | str) -> list[ModelCard]:
    """What this key may use: the base model and the tenant's adapters, within the key's scope."""
    tenant_id, auth = _tenant_of(tenant)
    cards = []
    if ctx.engine.model_name and model_allowed(auth, ctx.engine.model_name):
        cards.append(ModelCard(id=ctx.engine.model_name, created=0, owned_by="loraplex"))
    for a in adapters_repo.list_adapters(session, tenant_id=tenant_id, include_superseded=False):
        if not model_allowed(auth, a.name):
            continue
        owner = "shared" if a.visibility == "shared" else (a.owner_tenant_id or "")
        cards.append(ModelCard(id=a.name, created=int(a.created_at.timestamp()), owned_by=owner))
    return cards


def resolve_model(session: Session, ctx, tenant: TenantAuth | str, model: str) -> Adapter | None:
    """None for the base model; the served adapter version otherwise; NotFound if not usable,
    403 if the key's scope excludes it, 503 if it cannot be served now."""
    tenant_id, auth = _tenant_of(tenant)
    if model == ctx.engine.model_name:
        check_model_allowed(auth, model)
        return None
    adapter = adapters_repo.active_by_name(session, model)
    if adapter is None or not adapters_repo.is_usable_by(session, adapter, tenant_id):
        raise NotFound(
            f"the model {model!r} does not exist or you do not have access to it", param="model", code="model_not_found"
        )
    check_model_allowed(auth, model)
    if adapter.status == "unavailable":
        raise ServiceUnavailable(
            f"the model {model!r} is unavailable: {adapter.status_reason}",
            param="model",
            code="model_unavailable",
            headers={"retry-after": "30"},
        )
    return adapter


async def serve_model(ctx, tenant: TenantAuth | str, model: str, adapter: Adapter | None) -> Adapter | None:
    """Make a by-reference ``adapter`` usable by the engine (fetched on its first use); call it
    with no database session open: the wait for the store holds neither a connection nor a
    thread. New content at the source is recorded as the next version (a short transaction of its
    own) and that version is served; 503 ``model_unavailable`` if the store cannot deliver."""
    if adapter is None or not adapter.source_uri or not ctx.engine.enabled:
        return adapter
    changed = await ctx.sources.ensure_served_async(adapter)
    if changed is None:
        return adapter
    await asyncio.to_thread(references.record_changed_content, ctx, adapter, changed)
    newer = await asyncio.to_thread(_look_up_again, ctx, tenant, model)
    if newer is None or newer.id == adapter.id or not newer.source_uri:
        raise ModelUnavailable(
            f"the model {model!r} changed at its source while it was fetched; try again",
            param="model",
            headers={"retry-after": "1"},
        )
    if await ctx.sources.ensure_served_async(newer) is not None:
        raise ModelUnavailable(
            f"the model {model!r} changed at its source again while it was fetched; try again",
            param="model",
            headers={"retry-after": "1"},
        )
    return newer


def _look_up_again(ctx, tenant: TenantAuth | str, model: str) -> Adapter | None:
    with unit_of_work(ctx.sessions) as session:
        return resolve_model(session, ctx, tenant, model)
