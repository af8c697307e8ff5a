"""Pure pieces of a generation's stream: engine outputs -> per-choice ``Delta``s.

``Generation.deltas`` (generation.py) owns the lifecycle (billing, timeout, abort); these functions
own only what a delta holds, so each can be tested on hand-made outputs without an engine. The other
pieces of a delta's way to the wire live beside their formats: stop strings are cut (and their
possible prefixes held back) by the engine's output processor, before any text reaches here; tool
calls become OpenAI deltas in ``tools.ToolStream``; logprobs are laid out by ``logprobs_format``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# A generation that ran out of time reads as "length" (documented in docs/openai-api.md): the
# client got all the engine produced, cut by a limit, as with max_tokens.
TIMEOUT_FINISH_REASON = "length"


@dataclass
class Delta:
    text: str
    finish_reason: str | None
    completion_tokens: int  # all choices of the request, delivered so far
    index: int = 0  # the sample (choice) within this prompt
    logprobs: list = field(default_factory=list)  # engine TokenLogprobs of this choice's new tokens
    prompt_logprobs: list | None = None  # the request's, on its final deltas (prompt_logprobs asked)


def new_tokens(out: Any) -> int:
    """Completion tokens this engine output adds (all choices: a DELTA output holds only new ones)."""
    return sum(len(c.token_ids) for c in out.outputs)


def cached_tokens(out: Any, prompt_tokens: int) -> int:
    """Prompt tokens the engine served from its prefix cache (billed at the cached input price).
    Bounded by the prompt: a cached count can never exceed what was billed as prompt."""
    metrics = getattr(out, "metrics", None) or {}
    return max(0, min(int(metrics.get("num_cached_tokens") or 0), prompt_tokens))


def is_abort(out: Any) -> bool:
    """The engine ended the request because it was aborted (client gone, operator, shutdown)."""
    return bool(out.finished) and any(c.finish_reason == "abort" for c in out.outputs)


def choice_deltas(out: Any, done: set[int], delivered: int) -> list[Delta]:
    """One delta per choice that moved or ended in this engine output; ``done`` (the choices that
    already ended) is updated. A choice that ended is not given another delta: with n > 1 the
    engine keeps reporting the others, and a second finish would end the choice twice on the wire.
    A choice with nothing new (no text, no logprobs, not finished) gets no delta: the engine can
    report a token whose text is still held back (a stop string's prefix, a partial UTF-8 char)."""
    pending = []
    for comp in out.outputs:
        if comp.index in done:
            continue
        finished = comp.finish_reason is not None or out.finished
        if finished:
            done.add(comp.index)
        lps = comp.logprobs or []
        if comp.text or finished or lps:
            reason = str(comp.finish_reason) if finished and comp.finish_reason is not None else None
            plps = getattr(out, "prompt_logprobs", None) if finished else None
            pending.append(Delta(comp.text, reason, delivered, comp.index, lps, plps))
    return pending


def timeout_deltas(n: int, done: Iterable[int], delivered: int) -> list[Delta]:
    """The closing delta of every choice still open when the generation timeout ended the request."""
    ended = set(done)
    return [Delta("", TIMEOUT_FINISH_REASON, delivered, i) for i in range(n) if i not in ended]
