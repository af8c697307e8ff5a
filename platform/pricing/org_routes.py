"""Tenant routes in OpenAI's Usage and Costs API shapes, answered with the tenant's own API key
and scoped to that key's tenant: a key never sees another tenant's records."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.auth.key_scopes import check_model_allowed
from loraplex.platform.deps import ContextDep, MeteredTenantDep, SessionDep
from loraplex.platform.pricing import org

router = APIRouter(prefix="/v1/organization", tags=["organization"])

Time = Annotated[int, Query(ge=0, le=org.MAX_TIME + 1, description="Unix seconds")]
Limit = Annotated[int | None, Query(ge=1, le=1440)]


def _listed(request: Request, name: str) -> list[str]:
    """An array query parameter, as ``name=a&name=b`` or the ``name[]=a`` form some clients send."""
    values = request.query_params.getlist(name) + request.query_params.getlist(f"{name}[]")
    return [v for item in values for v in item.split(",") if v]


def _or_none(values: list[str]) -> list[str] | None:
    return values or None


def _scoped_models(tenant: TenantAuth, asked: list[str]) -> list[str] | None:
    """The models a key may read usage of: a key scoped to models reads theirs only (403 for a
    filter naming another, as at generation); None = every model of its tenant."""
    if tenant.allowed_models is None:
        return asked or None
    for model in asked:
        check_model_allowed(tenant, model)
    return asked or list(tenant.allowed_models)


def _flush(ctx: ContextDep) -> None:
    try:
        ctx.ledger.flush()
    except TimeoutError:
        pass


@router.get("/usage/completions")
def usage_completions(
    request: Request,
    ctx: ContextDep,
    session: SessionDep,
    tenant: MeteredTenantDep,
    start_time: Time,
    end_time: Time | None = None,
    bucket_width: Literal["1m", "1h", "1d"] = "1d",
    limit: Limit = None,
    page: Annotated[str | None, Query(max_length=64)] = None,
) -> dict:
    """Tokens in (and from the prefix cache) and out, and requests, per time bucket, of this
    key's tenant. ``group_by``: project_id, api_key_id, model; filters: api_key_ids, models, project_ids."""
    p = org.page_of(start_time, end_time, bucket_width, limit, page, org.USAGE_LIMITS)
    group_by = org.check_groups(_listed(request, "group_by"), org.USAGE_GROUPS)
    _flush(ctx)
    return org.usage_completions(
        session,
        tenant.tenant_id,
        p,
        group_by,
        api_key_ids=_or_none(_listed(request, "api_key_ids")),
        models=_scoped_models(tenant, _listed(request, "models")),
        project_ids=_listed(request, "project_ids"),
    )


@router.get("/costs")
def costs(
    request: Request,
    ctx: ContextDep,
    session: SessionDep,
    tenant: MeteredTenantDep,
    start_time: Time,
    end_time: Time | None = None,
    bucket_width: Literal["1d"] = "1d",
    limit: Annotated[int | None, Query(ge=1, le=180)] = None,
    page: Annotated[str | None, Query(max_length=64)] = None,
) -> dict:
    """This key's tenant's costs per day, each record at the price in force when it was served.
    ``group_by``: project_id, line_item (OpenAI's), api_key_id, model (loraplex's); filters:
    project_ids (OpenAI's), models (loraplex's)."""
    p = org.page_of(start_time, end_time, bucket_width, limit, page, org.COSTS_LIMITS)
    group_by = org.check_groups(_listed(request, "group_by"), org.COSTS_GROUPS)
    _flush(ctx)
    return org.costs(
        session,
        tenant.tenant_id,
        p,
        group_by,
        models=_scoped_models(tenant, _listed(request, "models")),
        project_ids=_listed(request, "project_ids"),
    )
