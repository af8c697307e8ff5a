from __future__ import annotations

from fastapi import APIRouter

from loraplex.platform.deps import AdminDep, ContextDep, SessionDep
from loraplex.platform.quotas import service
from loraplex.platform.quotas.schemas import QuotaIn, QuotaOut

router = APIRouter(prefix="/tenants/{tenant_id}/quota", tags=["quotas"])


@router.put("", response_model=QuotaOut)
def put_quota(tenant_id: str, body: QuotaIn, session: SessionDep, ctx: ContextDep, actor: AdminDep) -> QuotaOut:
    """Replace the tenant's limits (fields left out become unlimited)."""
    return QuotaOut.model_validate(service.put_quota(session, ctx, actor, tenant_id, body.model_dump()))


@router.get("", response_model=QuotaOut)
def get_quota(tenant_id: str, session: SessionDep, _actor: AdminDep) -> QuotaOut:
    return QuotaOut.model_validate(service.get_quota(session, tenant_id))
