"""OpenAI response bodies (one JSON or SSE chunks) for prompts x n choices, with logprobs, echo and
tool calls. Choice ``index`` = prompt_index * n + sample_index, as OpenAI numbers them."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, StreamingResponse

from loraplex.platform.errors import PlatformError
from loraplex.platform.http_errors import error_body
from loraplex.platform.inference import generation
from loraplex.platform.inference.tools import ToolPlan, ToolStream, finish_reason, parse_output

if TYPE_CHECKING:
    from loraplex.platform.context import PlatformContext


@dataclass
class Shape:
    chat: bool
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None  # top-k per token when logprobs are asked for
    echo: list[str] | None = None  # completions: the prompt texts to prepend
    prompt_logprobs: bool = False  # vLLM's prompt_logprobs asked (never with stream)
    tools: ToolPlan | None = None


async def respond(ctx: PlatformContext, preps: list[generation.Prepared], shape: Shape, tokenizer: Any):
    gens = await _start_all(ctx, preps, shape.stream)  # 4xx/503 here, before any byte of the response
    first = preps[0]
    rid = ("chatcmpl-" if shape.chat else "cmpl-") + first.request_id
    base = {"id": rid, "created": first.created, "model": first.model}
    fmt = _Logprobs(tokenizer, shape.chat)
    if shape.stream:
        return StreamingResponse(
            _sse(gens, preps, shape, base, fmt), media_type="text/event-stream", headers=_headers(gens)
        )
    return await _collect(gens, preps, shape, base, fmt)


async def _start_all(
    ctx: PlatformContext, preps: list[generation.Prepared], streaming: bool
) -> list[generation.Generation]:
    """Submit every prompt's request; if one is refused, end the started ones and give the rest back."""
    gens: list[generation.Generation] = []
    try:
        for p in preps:
            gens.append(await generation.start(ctx, p, streaming=streaming))
    except BaseException:
        for g in gens:
            ctx.gateway.abort(g.prep.request_id)
            g.finish("error")
        for p in preps[len(gens) + 1 :]:
            ctx.quotas.cancel(p.reservation)
        raise
    return gens


async def _collect(gens, preps, shape: Shape, base: dict, fmt: _Logprobs) -> JSONResponse:
    texts: dict[int, list[str]] = defaultdict(list)
    lps: dict[int, list] = defaultdict(list)
    finish: dict[int, str | None] = {}
    completion = [0] * len(preps)
    prompt_lps: dict[int, list] = {}  # prompt index -> the engine's prompt logprobs
    async for k, d in _merge([g.deltas() for g in gens]):
        idx = k * shape.n + d.index
        if d.prompt_logprobs is not None:
            prompt_lps[k] = d.prompt_logprobs
        texts[idx].append(d.text)
        lps[idx].extend(d.logprobs)
        if d.finish_reason is not None:
            finish[idx] = d.finish_reason
        completion[k] = d.completion_tokens
    choices = []
    for idx in range(len(preps) * shape.n):
        text = "".join(texts[idx])
        reason = finish.get(idx)
        if shape.chat:
            plan = shape.tools or ToolPlan()
            content, calls = parse_output(plan, text)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [c.as_dict() for c in calls]
            choices.append(
                {
                    "index": idx,
                    "message": message,
                    "finish_reason": finish_reason(plan, reason, calls),
                    "logprobs": fmt.chat(lps[idx]) if shape.logprobs is not None else None,
                }
            )
        else:
            echo = shape.echo[idx // shape.n] if shape.echo else ""
            choices.append(
                {
                    "index": idx,
                    "text": echo + text,
                    "finish_reason": reason,
                    "logprobs": fmt.completion(lps[idx], len(echo)) if shape.logprobs is not None else None,
                }
            )
            if shape.prompt_logprobs:  # vLLM: per choice in completions
                choices[-1]["prompt_logprobs"] = fmt.prompt(prompt_lps.get(idx // shape.n))
    obj = "chat.completion" if shape.chat else "text_completion"
    body = {**base, "object": obj, "choices": choices, "usage": _usage(preps, completion)}
    if shape.prompt_logprobs and shape.chat:  # vLLM: one list for the chat's prompt
        body["prompt_logprobs"] = fmt.prompt(prompt_lps.get(0))
    return JSONResponse(body, headers=_headers(gens))


def _headers(gens: list[generation.Generation]) -> dict[str, str]:
    """The first prompt's rate-limit headers, and the replica(s) that served the response."""
    replicas = ",".join(dict.fromkeys(g.replica for g in gens))
    return {**gens[0].prep.headers, "x-loraplex-replica": replicas}


async def _sse(gens, preps, shape: Shape, base: dict, fmt: _Logprobs) -> AsyncIterator[str]:
    obj = "chat.completion.chunk" if shape.chat else "text_completion"
    completion = [0] * len(preps)
    total = len(preps) * shape.n
    streams = {i: ToolStream(shape.tools or ToolPlan()) for i in range(total)} if shape.chat else {}
    offsets: dict[int, int] = defaultdict(int)
    try:
        for idx in range(total):
            if shape.chat:
                choice = {
                    "index": idx,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            elif shape.echo:
                echo = shape.echo[idx // shape.n]
                offsets[idx] = len(echo)
                choice = {"index": idx, "text": echo, "logprobs": None, "finish_reason": None}
            else:
                continue
            yield _event({**base, "object": obj, "choices": [choice]})
        async for k, d in _merge([g.deltas() for g in gens]):
            completion[k] = d.completion_tokens
            idx = k * shape.n + d.index
            if shape.chat:
                delta, reason = streams[idx].delta(d.text, d.finish_reason)
                if delta is None and reason is None and not d.logprobs:
                    continue
                choice = {
                    "index": idx,
                    "delta": delta or {},
                    "finish_reason": reason,
                    "logprobs": fmt.chat(d.logprobs) if shape.logprobs is not None and d.logprobs else None,
                }
            else:
                choice = {
                    "index": idx,
                    "text": d.text,
                    "finish_reason": d.finish_reason,
                    "logprobs": fmt.completion(d.logprobs, offsets[idx]) if shape.logprobs is not None else None,
                }
                offsets[idx] += len(d.text)
            yield _event({**base, "object": obj, "choices": [choice]})
        if shape.include_usage:
            yield _event({**base, "object": obj, "choices": [], "usage": _usage(preps, completion)})
    except PlatformError as exc:
        yield _event(error_body(exc.message, exc.type, exc.param, exc.code))
    yield "data: [DONE]\n\n"


async def _merge(gens: list[AsyncIterator[generation.Delta]]) -> AsyncIterator[tuple[int, generation.Delta]]:
    """Interleave the prompts' delta streams; closing this closes (and so aborts) all of them."""
    if len(gens) == 1:
        try:
            async for d in gens[0]:
                yield 0, d
        finally:
            await gens[0].aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(k: int, gen) -> None:
        try:
            async for d in gen:
                await queue.put((k, d))
            await queue.put((k, end))
        except Exception as exc:  # re-raised in the consumer
            await queue.put((k, exc))

    tasks = [asyncio.create_task(pump(k, g)) for k, g in enumerate(gens)]
    try:
        live = len(gens)
        while live:
            k, item = await queue.get()
            if item is end:
                live -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield k, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for g in gens:
            await g.aclose()  # type: ignore[attr-defined]


def _usage(preps, completion: list[int]) -> dict:
    p = sum(len(x.prompt_ids) for x in preps)
    c = sum(completion)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _byte_decoder() -> dict[str, int]:
    # GPT-2's reversible byte <-> printable-char table, as every byte-level BPE uses it.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_DECODER = _byte_decoder()


class _Logprobs:
    """Engine TokenLogprobs -> the chat (``content`` list) or legacy completions layout."""

    def __init__(self, tokenizer: Any, chat: bool) -> None:
        self._tok = tokenizer
        self._cache: dict[int, str] = {}

    def _s(self, tid: int) -> str:
        s = self._cache.get(tid)
        if s is None:
            s = self._cache[tid] = self._tok.decode([tid])
        return s

    def _bytes(self, tid: int) -> list[int]:
        """The token's real bytes: a byte-level BPE piece maps back char by char (a piece that
        splits a UTF-8 character decodes to U+FFFD, its bytes do not); other vocabularies decode."""
        piece = self._tok.convert_ids_to_tokens(tid)
        if isinstance(piece, str) and piece and all(ch in _BYTE_DECODER for ch in piece):
            return [_BYTE_DECODER[ch] for ch in piece]
        return list(self._s(tid).encode("utf-8"))

    def chat(self, lps: list) -> dict:
        def entry(tid: int, lp: float) -> dict:
            return {"token": self._s(tid), "logprob": lp, "bytes": self._bytes(tid)}

        return {
            "content": [{**entry(x.token_id, x.logprob), "top_logprobs": [entry(t, v) for t, v in x.top]} for x in lps],
            "refusal": None,
        }

    def prompt(self, lps: list | None) -> list | None:
        """vLLM's prompt_logprobs: None for the first prompt token, then per token a dict keyed by
        token id: the prompt token itself and the top-k, each with logprob, rank and text."""
        if lps is None:
            return None
        out: list[dict | None] = [None]
        for x in lps:
            entry = {str(x.token_id): {"logprob": x.logprob, "rank": x.rank, "decoded_token": self._s(x.token_id)}}
            for rank, (t, v) in enumerate(x.top, 1):
                entry.setdefault(str(t), {"logprob": v, "rank": rank, "decoded_token": self._s(t)})
            out.append(entry)
        return out

    def completion(self, lps: list, offset: int) -> dict:
        tokens = [self._s(x.token_id) for x in lps]
        offsets = []
        for s in tokens:
            offsets.append(offset)
            offset += len(s)
        return {
            "tokens": tokens,
            "token_logprobs": [x.logprob for x in lps],
            "top_logprobs": [{self._s(t): v for t, v in x.top} for x in lps],
            "text_offset": offsets,
        }
