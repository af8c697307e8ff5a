"""The request path behind /v1/completions, /v1/chat/completions and /v1/responses: checks (the
body's own, ``check_sampling``), the tool plan and prompt, admission of every prompt (tokenize,
``max_tokens`` decided, the body's ``to_sampling_params``, quota reservation), then
``generation.start_all`` (submission; billing from here on) and ``render.render`` (the bodies; it
never submits). The Responses API goes through ``chat`` too, so there is one admission and one
billing path."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool

from loraplex.platform.budgets import admission as budget_admission
from loraplex.platform.errors import BadRequest
from loraplex.platform.inference import admission, chat_prompt, generation
from loraplex.platform.inference import service as inference_service
from loraplex.platform.inference.logprobs_format import LogprobsFormatter
from loraplex.platform.inference.openai_schemas import ChatRequest, CompletionRequest, _Common, check_extra_fields
from loraplex.platform.inference.render import Shape, render
from loraplex.platform.inference.structured import response_spec
from loraplex.platform.inference.tools import plan_tools

if TYPE_CHECKING:
    from loraplex.engine import RequestLimits
    from loraplex.platform.auth.key_cache import TenantAuth
    from loraplex.platform.context import PlatformContext


def request_limits(ctx: PlatformContext) -> RequestLimits:
    """The engine's per-request bounds as configured (``[engine]``): what the platform checks
    before it tokenizes (``bad_words``) uses the very numbers the engine enforces."""
    from loraplex.engine import RequestLimits

    names = [f.name for f in dataclasses.fields(RequestLimits)]
    return RequestLimits(**{n: getattr(ctx.settings.engine, n) for n in names})


async def _prepare_all(
    ctx: PlatformContext,
    tenant: TenantAuth,
    model: str,
    endpoint: str,
    prompts: list[tuple[list[str], Callable[[Any], list[int]]]],
    body: _Common,
    structured_output: tuple[str, str] | None,
    request_id: str | None,
) -> list[admission.Prepared]:
    """Admit one engine request per prompt, all of them or none: look the model and quota up (a
    short transaction), fetch an uncached adapter (awaited here: no thread or connection waits on
    the store), check and tokenize each prompt, then reserve every prompt's cost in one step."""
    target = await run_in_threadpool(admission.look_up, ctx, tenant, model)
    admission.precheck(ctx, tenant, target, len(prompts))
    adapter = await inference_service.serve_model(ctx, tenant, model, target.adapter)
    if adapter is not target.adapter:  # the store held a new version: it is served instead
        target = dataclasses.replace(target, adapter=adapter)
    tokenized = [
        await run_in_threadpool(
            admission.tokenize_prompt, ctx, tenant, endpoint, texts, tokenize, body, structured_output
        )
        for texts, tokenize in prompts
    ]
    preps = admission.admit(ctx, tenant, model, endpoint, target, tokenized)
    preps = await budget_admission.reserve(ctx, target, preps)  # budgets in currency (platform/budgets)
    for p in preps:
        p.user = body.user
        p.http_request_id = request_id
    return preps


def _check_prompt_logprobs(body: _Common) -> None:
    if body.prompt_logprobs is not None and body.stream:
        raise BadRequest("prompt_logprobs is not available when streaming", param="prompt_logprobs")


async def completions(body: CompletionRequest, ctx: PlatformContext, tenant: TenantAuth, request_id: str | None = None):
    check_extra_fields(body)
    _check_prompt_logprobs(body)
    if body.best_of is not None and body.best_of != body.n:
        raise BadRequest("best_of other than n is not supported", param="best_of", code="unsupported_parameter")
    echo_logprobs = body.echo and body.logprobs is not None
    if echo_logprobs and body.stream:
        raise BadRequest(
            "echo with logprobs is not available when streaming (the prompt's logprobs come with the answer)",
            param="echo",
            code="unsupported_parameter",
        )
    prompts = body.prompts()

    keep = body.truncate_prompt_tokens

    def tokenizer_for(p: str | list[int]) -> Callable[[Any], list[int]]:
        def tokenize(tok: Any) -> list[int]:
            ids = list(p) if isinstance(p, list) else tok.encode(p)
            return ids[-keep:] if keep is not None and len(ids) > keep else ids

        return tokenize

    tok = ctx.engine.tokenizer
    body.check_sampling(tok, request_limits(ctx))
    vocab = len(tok)
    for p in prompts:
        if isinstance(p, list) and any(not 0 <= t < vocab for t in p):
            bad = next(t for t in p if not 0 <= t < vocab)
            raise BadRequest(
                f"prompt token ids must be in the vocabulary [0, {vocab}), got {bad}",
                param="prompt",
                code="invalid_value",
            )
    preps = await _prepare_all(
        ctx,
        tenant,
        body.model,
        "completions",
        [([p] if isinstance(p, str) else [], tokenizer_for(p)) for p in prompts],
        body,
        response_spec(body),
        request_id,
    )
    echo = [p if isinstance(p, str) else tok.decode(p) for p in prompts] if body.echo else None
    gens = await generation.start_all(ctx, preps, streaming=body.stream)
    return await render(gens, _shape(body, chat=False, logprobs=body.logprobs, echo=echo), LogprobsFormatter(tok))


async def chat(body: ChatRequest, ctx: PlatformContext, tenant: TenantAuth, request_id: str | None = None):
    check_extra_fields(body)
    _check_prompt_logprobs(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    settings = ctx.settings.openai
    chat_prompt.check_request(body, settings.trust_request_chat_template)
    plan = plan_tools(body, settings.tool_call_parser, response_spec(body))
    spec = plan.spec  # tools and the answer's constraint together (tools.py)
    logprobs = body.sample_logprobs()
    template = chat_prompt.server_template(settings.chat_template, ctx.engine.model_dir)

    def tokenize(tok) -> list[int]:
        return chat_prompt.render(body, tok, plan, template)

    tok = ctx.engine.tokenizer
    body.check_sampling(tok, request_limits(ctx))
    texts = admission.chat_texts(body.messages, body.tools)  # tool calls and definitions count too
    preps = await _prepare_all(ctx, tenant, body.model, "chat.completions", [(texts, tokenize)], body, spec, request_id)
    gens = await generation.start_all(ctx, preps, streaming=body.stream)
    return await render(gens, _shape(body, chat=True, logprobs=logprobs, tools=plan), LogprobsFormatter(tok))


def _shape(body: _Common, *, chat: bool, logprobs: int | None, echo=None, tools=None) -> Shape:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return Shape(
        chat=chat,
        n=body.n,
        stream=body.stream,
        include_usage=include_usage,
        logprobs=logprobs,
        echo=echo,
        tools=tools,
        prompt_logprobs=body.prompt_logprobs,
    )
