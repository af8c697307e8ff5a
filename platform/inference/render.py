"""Rendering: the deltas of started generations -> OpenAI bodies (one JSON or SSE chunks) for
prompts x n choices, with logprobs, echo and tool calls. Choice ``index`` = prompt_index * n +
sample_index, as OpenAI numbers them.

Nothing here submits or bills (``generation.start_all`` did, ``Generation.deltas`` does): ``render``
only reads deltas. The bodies are built by ``BodyBuilder`` (non-streaming) and ``ChunkBuilder``
(streaming), pure classes over ``Delta``s that are tested without an engine."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse, StreamingResponse

from loraplex.platform.errors import PlatformError
from loraplex.platform.http.error_handlers import error_body
from loraplex.platform.inference import wire
from loraplex.platform.inference.deltas import Delta
from loraplex.platform.inference.fingerprint import system_fingerprint
from loraplex.platform.inference.generation import Generation, merge_deltas
from loraplex.platform.inference.logprobs_format import LogprobsFormatter, concat
from loraplex.platform.inference.tools import ToolPlan, ToolStream, finish_reason, parse_output


@dataclass
class Shape:
    """What the response looks like (from the request), independent of what is generated."""

    chat: bool
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None  # top-k per token when logprobs are asked for
    echo: list[str] | None = None  # completions: the prompt texts to prepend
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs top-k (never with stream)
    tools: ToolPlan | None = None


@dataclass
class Meta:
    """Each body's id, created, model and system_fingerprint; the prompts' token ids (usage, echoed
    logprobs)."""

    id: str
    created: int
    model: str
    prompt_ids: list[list[int]] = field(default_factory=list)
    system_fingerprint: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompt_ids)


async def render(gens: list[Generation], shape: Shape, fmt: LogprobsFormatter) -> JSONResponse | StreamingResponse:
    """The response of started generations (their refusals were HTTP errors before this)."""
    first = gens[0].prep
    meta = Meta(
        ("chatcmpl-" if shape.chat else "cmpl-") + first.request_id,
        first.created,
        first.model,
        [g.prep.prompt_ids for g in gens],
        system_fingerprint(gens[0].ctx.engine, first.adapter_id),
    )
    # The first prompt's rate-limit headers, and the replica(s) that served the response.
    headers = {**first.headers, "x-loraplex-replica": ",".join(dict.fromkeys(g.replica for g in gens))}
    deltas = merge_deltas([g.deltas() for g in gens])
    if shape.stream:
        return StreamingResponse(
            _sse(ChunkBuilder(shape, meta, fmt), deltas), media_type="text/event-stream", headers=headers
        )
    return JSONResponse(await _collect(BodyBuilder(shape, meta, fmt), deltas), headers=headers)


async def _collect(builder: BodyBuilder, deltas: AsyncIterator[tuple[int, Delta]]) -> dict:
    async for k, d in deltas:
        builder.add(k, d)
    return builder.body().dump()


async def _sse(builder: ChunkBuilder, deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[str]:
    try:
        for opening in builder.opening():
            yield _event(opening.dump())
        async for k, d in deltas:
            chunk = builder.chunk(k, d)
            if chunk is not None:
                yield _event(chunk.dump())
        if builder.shape.include_usage:
            yield _event(builder.usage_chunk().dump())
    except PlatformError as exc:
        yield _event(error_body(exc.message, exc.type, exc.param, exc.code))
    yield "data: [DONE]\n\n"


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class BodyBuilder:
    """A non-streaming body from every choice's deltas."""

    def __init__(self, shape: Shape, meta: Meta, fmt: LogprobsFormatter) -> None:
        self.shape, self.meta, self.fmt = shape, meta, fmt
        self._texts: dict[int, list[str]] = defaultdict(list)
        self._lps: dict[int, list] = defaultdict(list)
        self._finish: dict[int, str | None] = {}
        self._completion = [0] * len(meta.prompt_ids)  # per prompt: its request's delivered tokens
        self._prompt_lps: dict[int, list] = {}  # prompt index -> the engine's prompt logprobs

    def add(self, k: int, d: Delta) -> None:
        idx = k * self.shape.n + d.index
        if d.prompt_logprobs is not None:
            self._prompt_lps[k] = d.prompt_logprobs
        self._texts[idx].append(d.text)
        self._lps[idx].extend(d.logprobs)
        if d.finish_reason is not None:
            self._finish[idx] = d.finish_reason
        self._completion[k] = d.completion_tokens

    def usage(self) -> wire.Usage:
        return wire.Usage.of(self.meta.prompt_tokens, sum(self._completion))

    def body(self) -> wire.ChatCompletion | wire.Completion:
        total = len(self.meta.prompt_ids) * self.shape.n
        m = self.meta
        if self.shape.chat:
            extra = {}
            if self.shape.prompt_logprobs is not None:  # vLLM: one list for the chat's prompt
                extra["prompt_logprobs"] = self.fmt.prompt(self._prompt_lps.get(0), self.shape.prompt_logprobs)
            return wire.ChatCompletion(
                id=m.id,
                created=m.created,
                model=m.model,
                system_fingerprint=m.system_fingerprint,
                choices=[self._chat_choice(i) for i in range(total)],
                usage=self.usage(),
                **extra,
            )
        return wire.Completion(
            id=m.id,
            created=m.created,
            model=m.model,
            system_fingerprint=m.system_fingerprint,
            choices=[self._completion_choice(i) for i in range(total)],
            usage=self.usage(),
        )

    def _chat_choice(self, idx: int) -> wire.ChatChoice:
        plan = self.shape.tools or ToolPlan()
        content, calls = parse_output(plan, "".join(self._texts[idx]))
        message = wire.ChatMessage(content=content, tool_calls=[c.as_dict() for c in calls] if calls else None)
        return wire.ChatChoice(
            index=idx,
            message=message,
            finish_reason=finish_reason(plan, self._finish.get(idx), calls),
            logprobs=self.fmt.chat(self._lps[idx]) if self.shape.logprobs is not None else None,
        )

    def _completion_choice(self, idx: int) -> wire.CompletionChoice:
        k = idx // self.shape.n
        echo = self.shape.echo[k] if self.shape.echo else ""
        lps = None
        if self.shape.logprobs is not None:
            lps = self.fmt.completion(self._lps[idx], len(echo))
            if self.shape.echo:  # the prompt's tokens and logprobs first (OpenAI, vLLM)
                prompt = self.fmt.echoed_prompt(
                    self.meta.prompt_ids[k], self._prompt_lps.get(k) or [], self.shape.logprobs
                )
                lps = concat(prompt, lps)
        extra = {}
        if self.shape.prompt_logprobs is not None:  # vLLM: per choice in completions
            extra["prompt_logprobs"] = self.fmt.prompt(self._prompt_lps.get(k), self.shape.prompt_logprobs)
        return wire.CompletionChoice(
            index=idx,
            text=echo + "".join(self._texts[idx]),
            finish_reason=self._finish.get(idx),
            logprobs=lps,
            **extra,
        )


class ChunkBuilder:
    """SSE chunks: an opening chunk per choice (chat: the role; completions with echo: the prompt),
    one chunk per delta that carries something, and the usage chunk when asked."""

    def __init__(self, shape: Shape, meta: Meta, fmt: LogprobsFormatter) -> None:
        self.shape, self.meta, self.fmt = shape, meta, fmt
        self.total = len(meta.prompt_ids) * shape.n
        self._completion = [0] * len(meta.prompt_ids)
        plan = shape.tools or ToolPlan()
        self._tools = {i: ToolStream(plan) for i in range(self.total)} if shape.chat else {}
        self._offsets: dict[int, int] = defaultdict(int)  # completions: each choice's text so far

    def _head(self) -> dict:
        m = self.meta
        return {"id": m.id, "created": m.created, "model": m.model, "system_fingerprint": m.system_fingerprint}

    def opening(self) -> list[wire.ChatChunk | wire.CompletionChunk]:
        out: list[wire.ChatChunk | wire.CompletionChunk] = []
        for idx in range(self.total):
            if self.shape.chat:
                delta = wire.ChatDelta(role="assistant", content="")
                out.append(wire.ChatChunk(**self._head(), choices=[wire.ChatChunkChoice(index=idx, delta=delta)]))
            elif self.shape.echo:
                echo = self.shape.echo[idx // self.shape.n]
                self._offsets[idx] = len(echo)
                choice = wire.CompletionChunkChoice(index=idx, text=echo)
                out.append(wire.CompletionChunk(**self._head(), choices=[choice]))
        return out

    def chunk(self, k: int, d: Delta) -> wire.ChatChunk | wire.CompletionChunk | None:
        self._completion[k] = d.completion_tokens
        idx = k * self.shape.n + d.index
        if self.shape.chat:
            delta, reason = self._tools[idx].delta(d.text, d.finish_reason)
            if delta is None and reason is None and not d.logprobs:
                return None  # text held back by the tool parser, nothing else new
            lps = self.fmt.chat(d.logprobs) if self.shape.logprobs is not None and d.logprobs else None
            choice = wire.ChatChunkChoice(index=idx, delta=delta or {}, finish_reason=reason, logprobs=lps)
            return wire.ChatChunk(**self._head(), choices=[choice])
        clps = self.fmt.completion(d.logprobs, self._offsets[idx]) if self.shape.logprobs is not None else None
        self._offsets[idx] += len(d.text)
        text_choice = wire.CompletionChunkChoice(index=idx, text=d.text, finish_reason=d.finish_reason, logprobs=clps)
        return wire.CompletionChunk(**self._head(), choices=[text_choice])

    def usage_chunk(self) -> wire.ChatChunk | wire.CompletionChunk:
        usage = wire.Usage.of(self.meta.prompt_tokens, sum(self._completion))
        if self.shape.chat:
            return wire.ChatChunk(**self._head(), choices=[], usage=usage)
        return wire.CompletionChunk(**self._head(), choices=[], usage=usage)
