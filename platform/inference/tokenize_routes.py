"""/tokenize and /detokenize (vLLM's paths): tenant-authenticated, resolved per model like
generation, so a tenant learns nothing about models it may not use. The same bounds as generation
apply (body size, characters, the key's model scope, the tenant's and the key's rpm and concurrency
limits), so tokenizing is no way around them. Every adapter of the base model shares its tokenizer,
so the adapter is checked for access and the base tokenizer answers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from loraplex.platform.auth import key_scopes
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.deps import ContextDep, MeteredTenantDep, SessionDep
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.admission import chat_texts, check_text, context_len
from loraplex.platform.inference.openai_schemas import MAX_TOOLS, ChatMessage, Tool
from loraplex.platform.inference.service import resolve_model
from loraplex.platform.quotas import repository as quotas_repo

router = APIRouter(tags=["openai"])


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Annotated[str, Field(min_length=1)]
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    # As in a chat request: the tools the template shows (the tokens chat would bill), and vLLM's
    # template controls, so the count is the prompt a chat request with the same fields is billed.
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    continue_final_message: bool = False
    chat_template: Annotated[str, Field(max_length=256 * 1024)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: Annotated[list[dict[str, str]], Field(max_length=1024)] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Annotated[str, Field(min_length=1)]
    tokens: list[Annotated[int, Field(ge=0)]]


def _admit(session, ctx, tenant: TenantAuth, model: str) -> None:
    """Like generation: the model must be usable by this key (404 unknown, 403 outside its scope),
    and a tenant or key at its concurrency limit is refused here too (the rpm was counted by
    ``MeteredTenantDep``; tokenizing costs no tokens)."""
    resolve_model(session, ctx, tenant, model)
    q = quotas_repo.get(session, tenant.tenant_id)
    key_scopes.precheck_concurrency(ctx.quotas, tenant, q.max_concurrent if q else None)


@router.post("/tokenize")
def tokenize(body: TokenizeRequest, session: SessionDep, ctx: ContextDep, tenant: MeteredTenantDep) -> dict:
    if (body.prompt is None) == (body.messages is None):
        raise BadRequest("give exactly one of prompt or messages", param="prompt")
    _admit(session, ctx, tenant, body.model)
    tok = ctx.engine.tokenizer
    # The generation routes' character bound (and text validity), before any templating.
    texts = chat_texts(body.messages) if body.messages is not None else [body.prompt or ""]
    param = "messages" if body.messages is not None else "prompt"
    check_text(texts, param, ctx.engine.max_prompt_chars(), context_len(ctx.engine))
    if body.messages is not None:
        from loraplex.platform.inference import chat_prompt
        from loraplex.platform.inference.openai_schemas import ChatRequest
        from loraplex.platform.inference.tools import plan_tools

        # Rendered exactly as a chat request renders it (the server's template, the tools).
        chat = ChatRequest(
            model=body.model,
            messages=body.messages,
            tools=body.tools,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            chat_template=body.chat_template,
            chat_template_kwargs=body.chat_template_kwargs,
            documents=body.documents,
        )
        settings = ctx.settings.openai
        chat_prompt.check_request(chat, settings.trust_request_chat_template)
        template = chat_prompt.server_template(settings.chat_template, ctx.engine.model_dir)
        ids = chat_prompt.render(chat, tok, plan_tools(chat, settings.tool_call_parser), template)
    else:
        ids = tok.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": ctx.engine.max_model_len}


@router.post("/detokenize")
def detokenize(body: DetokenizeRequest, session: SessionDep, ctx: ContextDep, tenant: MeteredTenantDep) -> dict:
    _admit(session, ctx, tenant, body.model)
    tok = ctx.engine.tokenizer
    if len(body.tokens) > ctx.engine.max_model_len:
        raise BadRequest(
            f"{len(body.tokens)} tokens are more than the model's context ({ctx.engine.max_model_len})",
            param="tokens",
            code="context_length_exceeded",
        )
    vocab = len(tok)
    bad = [t for t in body.tokens if t >= vocab]
    if bad:
        raise BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
    return {"prompt": tok.decode(body.tokens)}
