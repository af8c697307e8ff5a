"""Tenant-side model resolution: the OpenAI ``model`` field names the base model or an adapter
the tenant may use, and the API key's scope allows. An adapter registered by reference is fetched
and registered with the engine on its first use (503 ``model_unavailable`` if it cannot be)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from loraplex.platform.adapters import references
from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.adapters.models import Adapter
from loraplex.platform.adapters.sources.resolver import ContentChanged
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.auth.key_scopes import check_model_allowed, model_allowed
from loraplex.platform.errors import NotFound, ServiceUnavailable
from loraplex.platform.inference.schemas import ModelCard


def _tenant_of(tenant: TenantAuth | str) -> tuple[str, TenantAuth | None]:
    return (tenant.tenant_id, tenant) if isinstance(tenant, TenantAuth) else (tenant, None)


def list_models(session: Session, ctx, tenant: TenantAuth | str) -> list[ModelCard]:
    """What this key may use: the base model and the tenant's adapters, within the key's scope."""
    tenant_id, auth = _tenant_of(tenant)
    cards = []
    if ctx.gateway.model_name and model_allowed(auth, ctx.gateway.model_name):
        cards.append(ModelCard(id=ctx.gateway.model_name, created=0, owned_by="loraplex"))
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
    if model == ctx.gateway.model_name:
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
    if adapter.source_uri and ctx.gateway.enabled:
        try:
            ctx.sources.ensure_served(adapter, lambda a, fetched: references.record_changed_content(ctx, a, fetched))
        except ContentChanged:
            # The store holds new content: it was just registered as the next version; serve that.
            session.expire_all()
            newer = adapters_repo.active_by_name(session, model)
            if newer is None or newer.id == adapter.id or not newer.source_uri:
                raise
            ctx.sources.ensure_served(newer, lambda a, fetched: references.record_changed_content(ctx, a, fetched))
            return newer
    return adapter
