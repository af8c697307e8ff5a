"""The tenant-facing OpenAI-compatible API: /v1/models, /v1/completions, /v1/chat/completions.

Everything that can be refused before the first token is refused as an HTTP status, streaming or
not: the SSE response starts only once the engine has accepted the request and its usage record
is durable."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from loraplex.platform.deps import ContextDep, SessionDep, TenantDep
from loraplex.platform.errors import PlatformError
from loraplex.platform.http_errors import error_body
from loraplex.platform.inference import admission, generation, service
from loraplex.platform.inference.openai_schemas import ChatRequest, CompletionRequest
from loraplex.platform.inference.schemas import ModelList

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models", response_model=ModelList)
def list_models(session: SessionDep, ctx: ContextDep, tenant: TenantDep) -> ModelList:
    """The base model and every adapter this tenant may use."""
    return ModelList(data=service.list_models(session, ctx, tenant.tenant_id))


def _sampling(body, max_tokens: int) -> dict:
    return dict(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                seed=body.seed, stop=body.stop_list())


@router.post("/completions")
async def completions(body: CompletionRequest, ctx: ContextDep, tenant: TenantDep):
    texts = [body.prompt] if isinstance(body.prompt, str) else []

    def tokenize(tok):
        return list(body.prompt) if isinstance(body.prompt, list) else tok.encode(body.prompt)

    prep = await run_in_threadpool(admission.prepare, ctx, tenant, body.model, "completions", texts,
                                   tokenize, _sampling(body, body.max_tokens))
    return await _respond(ctx, prep, body, chat=False)


@router.post("/chat/completions")
async def chat_completions(body: ChatRequest, ctx: ContextDep, tenant: TenantDep):
    messages = [m.model_dump() for m in body.messages]

    def tokenize(tok):
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok.encode(text, add_special_tokens=False)

    prep = await run_in_threadpool(admission.prepare, ctx, tenant, body.model, "chat.completions",
                                   [m.content for m in body.messages], tokenize,
                                   _sampling(body, body.token_limit()))
    return await _respond(ctx, prep, body, chat=True)


async def _respond(ctx, prep: admission.Prepared, body, *, chat: bool):
    gen = await generation.start(ctx, prep, streaming=body.stream)  # 4xx/503 here, before any byte
    obj = "chat.completion" if chat else "text_completion"
    rid = ("chatcmpl-" if chat else "cmpl-") + prep.request_id
    base = {"id": rid, "created": prep.created, "model": prep.model}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(gen, base, obj, chat, include_usage),
                                 media_type="text/event-stream", headers=_headers(prep, gen))
    text, finish, completion = [], None, 0
    async for d in gen.deltas():
        text.append(d.text)
        finish, completion = d.finish_reason or finish, d.completion_tokens
    choice = ({"index": 0, "message": {"role": "assistant", "content": "".join(text)}, "finish_reason": finish}
              if chat else {"index": 0, "text": "".join(text), "finish_reason": finish, "logprobs": None})
    return JSONResponse({**base, "object": obj, "choices": [choice], "usage": _usage(prep, completion)},
                        headers=_headers(prep, gen))


def _headers(prep: admission.Prepared, gen: generation.Generation) -> dict[str, str]:
    return {**prep.headers, "x-loraplex-replica": gen.replica}


async def _sse(gen: generation.Generation, base, obj, chat, include_usage) -> AsyncIterator[str]:
    chunk_obj = obj + ".chunk" if chat else obj
    completion = 0
    try:
        if chat:
            yield _event({**base, "object": chunk_obj, "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
        async for d in gen.deltas():
            completion = d.completion_tokens
            choice = ({"index": 0, "delta": {"content": d.text} if d.text else {}, "finish_reason": d.finish_reason}
                      if chat else {"index": 0, "text": d.text, "finish_reason": d.finish_reason, "logprobs": None})
            yield _event({**base, "object": chunk_obj, "choices": [choice]})
        if include_usage:
            yield _event({**base, "object": chunk_obj, "choices": [], "usage": _usage(gen.prep, completion)})
    except PlatformError as exc:  # only what happens after the first byte (engine death, admin abort)
        yield _event(error_body(exc.message, exc.type, exc.param, exc.code))
    yield "data: [DONE]\n\n"


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _usage(prep, completion: int) -> dict:
    p = len(prep.prompt_ids)
    return {"prompt_tokens": p, "completion_tokens": completion, "total_tokens": p + completion}
