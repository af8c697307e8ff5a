"""The tenant-facing OpenAI-compatible API: /v1/models, /v1/completions, /v1/chat/completions,
/v1/responses (responses_api/).

Everything that can be refused before the first token is refused as an HTTP status, streaming or
not: the SSE response starts only once the engine has accepted the request and its usage record
is durable."""

from __future__ import annotations

from fastapi import APIRouter, Request

from loraplex.platform.deps import ContextDep, MeteredTenantDep, SessionDep, TenantDep
from loraplex.platform.errors import NotFound
from loraplex.platform.http import request_id
from loraplex.platform.inference import request_path, service
from loraplex.platform.inference.openai_schemas import ChatRequest, CompletionRequest
from loraplex.platform.inference.responses_api.routes import router as responses_router
from loraplex.platform.inference.schemas import ModelCard, ModelList

router = APIRouter(prefix="/v1", tags=["openai"])
router.include_router(responses_router)


@router.get("/models", response_model=ModelList)
def list_models(session: SessionDep, ctx: ContextDep, tenant: MeteredTenantDep) -> ModelList:
    """The base model and every adapter this tenant may use."""
    return ModelList(data=service.list_models(session, ctx, tenant))


@router.get("/models/{model_id:path}", response_model=ModelCard)
def get_model(model_id: str, session: SessionDep, ctx: ContextDep, tenant: MeteredTenantDep) -> ModelCard:
    """One model this key may use (404, like an unknown one, otherwise: a model outside the key's
    scope is not revealed, as the list does not show it)."""
    for card in service.list_models(session, ctx, tenant):
        if card.id == model_id:
            return card
    raise NotFound(
        f"the model {model_id!r} does not exist or you do not have access to it", param="model", code="model_not_found"
    )


@router.post("/completions")
async def completions(body: CompletionRequest, ctx: ContextDep, tenant: TenantDep, request: Request):
    return await request_path.completions(body, ctx, tenant, request_id.of(request.scope))


@router.post("/chat/completions")
async def chat_completions(body: ChatRequest, ctx: ContextDep, tenant: TenantDep, request: Request):
    return await request_path.chat(body, ctx, tenant, request_id.of(request.scope))
