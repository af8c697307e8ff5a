from __future__ import annotations

from fastapi import APIRouter

from loraplex.platform.deps import ContextDep, SessionDep, TenantDep
from loraplex.platform.inference import service
from loraplex.platform.inference.schemas import ModelList

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models", response_model=ModelList)
def list_models(session: SessionDep, ctx: ContextDep, tenant: TenantDep) -> ModelList:
    """The base model and every adapter this tenant may use."""
    return ModelList(data=service.list_models(session, ctx, tenant.tenant_id))
