"""The tenant-facing OpenAI-compatible API: /v1/models, /v1/completions, /v1/chat/completions.

Everything that can be refused before the first token is refused as an HTTP status, streaming or
not: the SSE response starts only once the engine has accepted the request and its usage record
is durable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from loraplex.platform.deps import ContextDep, SessionDep, TenantDep
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference import admission, service
from loraplex.platform.inference.openai_schemas import ChatRequest, CompletionRequest, _Common, check_extra_fields
from loraplex.platform.inference.responses import Shape, respond
from loraplex.platform.inference.schemas import ModelList
from loraplex.platform.inference.structured import Spec, response_spec
from loraplex.platform.inference.tools import plan_tools, template_messages

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models", response_model=ModelList)
def list_models(session: SessionDep, ctx: ContextDep, tenant: TenantDep) -> ModelList:
    """The base model and every adapter this tenant may use."""
    return ModelList(data=service.list_models(session, ctx, tenant))


def _sampling(body: _Common, max_tokens: int, logprobs: int | None, spec: Spec | None) -> dict:
    return dict(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop_list(),
        n=body.n,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        top_k=body.top_k,
        min_p=body.min_p,
        logit_bias=body.bias(),
        logprobs=logprobs,
        ignore_eos=body.ignore_eos,
        structured_output=spec,
    )


async def _prepare_all(
    ctx,
    tenant,
    model: str,
    endpoint: str,
    prompts: list[tuple[list[str], Callable[[Any], list[int]]]],
    sampling: dict,
    user: str | None,
) -> list[admission.Prepared]:
    """Admit one engine request per prompt (its texts are checked before it is tokenized); if a
    later one is refused, give the earlier ones' reservations back."""
    preps: list[admission.Prepared] = []
    try:
        for texts, tokenize in prompts:
            preps.append(
                await run_in_threadpool(admission.prepare, ctx, tenant, model, endpoint, texts, tokenize, sampling)
            )
            preps[-1].user = user
    except BaseException:
        for p in preps:
            ctx.quotas.cancel(p.reservation)
        raise
    return preps


@router.post("/completions")
async def completions(body: CompletionRequest, ctx: ContextDep, tenant: TenantDep):
    check_extra_fields(body)
    if body.best_of is not None and body.best_of != body.n:
        raise BadRequest("best_of other than n is not supported", param="best_of", code="unsupported_parameter")
    if body.echo and body.logprobs is not None:
        raise BadRequest(
            "echo with logprobs needs prompt logprobs, which loraplex does not compute",
            param="echo",
            code="unsupported_parameter",
        )
    prompts = body.prompts()

    def tokenizer_for(p: str | list[int]) -> Callable[[Any], list[int]]:
        return (lambda tok: list(p)) if isinstance(p, list) else (lambda tok: tok.encode(p))

    sampling = _sampling(body, body.max_tokens, body.logprobs, response_spec(body))
    preps = await _prepare_all(
        ctx,
        tenant,
        body.model,
        "completions",
        [([p] if isinstance(p, str) else [], tokenizer_for(p)) for p in prompts],
        sampling,
        body.user,
    )
    tok = ctx.gateway.tokenizer
    echo = [p if isinstance(p, str) else tok.decode(p) for p in prompts] if body.echo else None
    return await respond(ctx, preps, _shape(body, chat=False, logprobs=body.logprobs, echo=echo), tok)


@router.post("/chat/completions")
async def chat_completions(body: ChatRequest, ctx: ContextDep, tenant: TenantDep):
    check_extra_fields(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    plan = plan_tools(body)
    spec = plan.spec or response_spec(body)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None

    def tokenize(tok) -> list[int]:
        messages = template_messages(body, tok.chat_template or "")
        kwargs = {"tools": plan.template_tools} if plan.template_tools else {}
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        return tok.encode(text, add_special_tokens=False)

    sampling = _sampling(body, body.token_limit(), logprobs, spec)
    texts = [
        m.content if isinstance(m.content, str) else "".join(p.text or "" for p in m.content)
        for m in body.messages
        if m.content
    ]
    preps = await _prepare_all(ctx, tenant, body.model, "chat.completions", [(texts, tokenize)], sampling, body.user)
    return await respond(ctx, preps, _shape(body, chat=True, logprobs=logprobs, tools=plan), ctx.gateway.tokenizer)


def _shape(body: _Common, *, chat: bool, logprobs: int | None, echo=None, tools=None) -> Shape:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return Shape(
        chat=chat, n=body.n, stream=body.stream, include_usage=include_usage, logprobs=logprobs, echo=echo, tools=tools
    )
