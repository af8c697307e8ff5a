"""Tenant-side model resolution: the OpenAI ``model`` field names the base model or an adapter
the tenant may use."""

from __future__ import annotations

from sqlalchemy.orm import Session

from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.adapters.models import Adapter
from loraplex.platform.errors import NotFound, ServiceUnavailable
from loraplex.platform.inference.schemas import ModelCard


def list_models(session: Session, ctx, tenant_id: str) -> list[ModelCard]:
    cards = []
    if ctx.gateway.model_name:
        cards.append(ModelCard(id=ctx.gateway.model_name, created=0, owned_by="loraplex"))
    for a in adapters_repo.list_adapters(session, tenant_id=tenant_id, include_superseded=False):
        owner = "shared" if a.visibility == "shared" else (a.owner_tenant_id or "")
        cards.append(ModelCard(id=a.name, created=int(a.created_at.timestamp()), owned_by=owner))
    return cards


def resolve_model(session: Session, ctx, tenant_id: str, model: str) -> Adapter | None:
    """None for the base model; the served adapter version otherwise; NotFound if not usable."""
    if model == ctx.gateway.model_name:
        return None
    adapter = adapters_repo.active_by_name(session, model)
    if adapter is None or not adapters_repo.is_usable_by(session, adapter, tenant_id):
        raise NotFound(
            f"the model {model!r} does not exist or you do not have access to it", param="model", code="model_not_found"
        )
    if adapter.status == "unavailable":
        raise ServiceUnavailable(
            f"the model {model!r} is unavailable: {adapter.status_reason}",
            param="model",
            code="model_unavailable",
            headers={"retry-after": "30"},
        )
    return adapter
