"""The request path behind /v1/completions, /v1/chat/completions and /v1/responses: checks, the
tool plan and prompt, sampling values, admission (quota reservation) of every prompt, then
``responses.respond`` (generation and billing). The Responses API goes through ``chat`` too, so there
is one admission and one billing path."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference import admission, chat_prompt
from loraplex.platform.inference.openai_schemas import ChatRequest, CompletionRequest, _Common, check_extra_fields
from loraplex.platform.inference.responses import Shape, respond
from loraplex.platform.inference.structured import Spec, response_spec
from loraplex.platform.inference.tools import plan_tools

if TYPE_CHECKING:
    from loraplex.platform.auth.key_cache import TenantAuth
    from loraplex.platform.context import PlatformContext


def _extensions(body: _Common, tok: Any) -> dict:
    """vLLM's sampling extensions, checked against the tokenizer."""
    if body.priority != 0:
        raise BadRequest(
            "per-request priority is not supported (a tenant's priority is set by the operator)",
            param="priority",
            code="unsupported_parameter",
        )
    # The tokenizer's vocabulary, for every token-id field: the model's embedding may have more rows
    # (padding), ids that decode to no text (a logit_bias on one made the answer empty).
    vocab = len(tok)
    for name, ids in (
        ("allowed_token_ids", body.allowed_token_ids or []),
        ("stop_token_ids", body.stop_token_ids or []),
        ("logit_bias", list(body.bias() or {})),
    ):
        if any(t >= vocab for t in ids):
            raise BadRequest(f"{name} holds a token id outside the vocabulary [0, {vocab})", param=name)
    words: list[list[int]] = []
    for w in body.bad_words or []:  # as vLLM: the word alone and after a space
        for form in (w, " " + w.lstrip()):
            ids = tok.encode(form, add_special_tokens=False)
            if ids and ids not in words:
                words.append(ids)
    return dict(
        min_tokens=body.min_tokens,
        stop_token_ids=body.stop_token_ids or [],
        bad_words_token_ids=words,
        allowed_token_ids=body.allowed_token_ids,
        include_stop_str_in_output=body.include_stop_str_in_output,
    )


def _sampling(body: _Common, max_tokens: int | None, logprobs: int | None, spec: Spec | None, tok: Any) -> dict:
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
        prompt_logprobs=body.prompt_logprobs,
        ignore_eos=body.ignore_eos,
        structured_output=spec,
        **_extensions(body, tok),
    )


async def _prepare_all(
    ctx: PlatformContext,
    tenant: TenantAuth,
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


def _check_prompt_logprobs(body: _Common) -> None:
    if body.prompt_logprobs is not None and body.stream:
        raise BadRequest("prompt_logprobs is not available when streaming", param="prompt_logprobs")


async def completions(body: CompletionRequest, ctx: PlatformContext, tenant: TenantAuth):
    check_extra_fields(body)
    _check_prompt_logprobs(body)
    if body.best_of is not None and body.best_of != body.n:
        raise BadRequest("best_of other than n is not supported", param="best_of", code="unsupported_parameter")
    if body.echo and body.logprobs is not None:
        raise BadRequest(
            "echo with logprobs needs prompt logprobs, which loraplex does not compute",
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

    sampling = _sampling(body, body.max_tokens, body.logprobs, response_spec(body), ctx.gateway.tokenizer)
    vocab = len(ctx.gateway.tokenizer)
    for p in prompts:
        if isinstance(p, list) and any(t >= vocab for t in p):
            bad = next(t for t in p if t >= vocab)
            raise BadRequest(f"prompt token ids must be in the vocabulary [0, {vocab}), got {bad}", param="prompt")
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


async def chat(body: ChatRequest, ctx: PlatformContext, tenant: TenantAuth):
    check_extra_fields(body)
    _check_prompt_logprobs(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    settings = ctx.settings.openai
    chat_prompt.check_request(body, settings.trust_request_chat_template)
    plan = plan_tools(body, settings.tool_call_parser)
    spec = plan.spec or response_spec(body)
    if plan.spec is not None and response_spec(body) is not None:
        raise BadRequest("a required or named tool_choice cannot be combined with another output constraint")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    template = chat_prompt.server_template(settings.chat_template, ctx.gateway.model_dir)

    def tokenize(tok) -> list[int]:
        return chat_prompt.render(body, tok, plan, template)

    sampling = _sampling(body, body.token_limit(), logprobs, spec, ctx.gateway.tokenizer)
    texts = admission.chat_texts(body.messages, body.tools)  # tool calls and definitions count too
    preps = await _prepare_all(ctx, tenant, body.model, "chat.completions", [(texts, tokenize)], sampling, body.user)
    return await respond(ctx, preps, _shape(body, chat=True, logprobs=logprobs, tools=plan), ctx.gateway.tokenizer)


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
        prompt_logprobs=body.prompt_logprobs is not None,
    )
