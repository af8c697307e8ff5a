"""/tokenize and /detokenize (vLLM's paths): tenant-authenticated, resolved per model like
generation, so a tenant learns nothing about models it may not use. Every adapter of the base
model shares its tokenizer, so the adapter is checked for access and the base tokenizer answers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from loraplex.platform.deps import ContextDep, SessionDep, TenantDep
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import ChatMessage
from loraplex.platform.inference.service import resolve_model

router = APIRouter(tags=["openai"])


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Annotated[str, Field(min_length=1)]
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Annotated[str, Field(min_length=1)]
    tokens: list[Annotated[int, Field(ge=0)]]


@router.post("/tokenize")
def tokenize(body: TokenizeRequest, session: SessionDep, ctx: ContextDep, tenant: TenantDep) -> dict:
    resolve_model(session, ctx, tenant.tenant_id, body.model)
    tok = ctx.gateway.tokenizer
    if (body.prompt is None) == (body.messages is None):
        raise BadRequest("give exactly one of prompt or messages", param="prompt")
    if body.messages is not None:
        from loraplex.platform.inference.openai_schemas import ChatRequest
        from loraplex.platform.inference.tools import template_messages

        chat = ChatRequest(model=body.model, messages=body.messages)
        text = tok.apply_chat_template(
            template_messages(chat, tok.chat_template or ""),
            add_generation_prompt=body.add_generation_prompt,
            tokenize=False,
        )
        ids = tok.encode(text, add_special_tokens=False)
    else:
        ids = tok.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": ctx.gateway.max_model_len}


@router.post("/detokenize")
def detokenize(body: DetokenizeRequest, session: SessionDep, ctx: ContextDep, tenant: TenantDep) -> dict:
    resolve_model(session, ctx, tenant.tenant_id, body.model)
    tok = ctx.gateway.tokenizer
    vocab = len(tok)
    bad = [t for t in body.tokens if t >= vocab]
    if bad:
        raise BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
    return {"prompt": tok.decode(body.tokens)}
