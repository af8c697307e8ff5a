"""The checkpoint of a request streaming from an engine replica: what its reader has received.

When the replica dies (or stops answering), ``RemoteStream`` sends the request again to another
replica *from this checkpoint*: the prompt plus the tokens already received, as the engine's
``resume_token_ids`` (they count as output there: ``max_tokens``, penalties, stop strings across
the boundary, the grammar, a seeded sample's generator advanced past them). The engine's outputs
are those of the uninterrupted request, so the new replica's first output repeats the received
tokens and their text; ``record`` drops exactly that much (tokens, logprobs, characters), so the
reader — the streaming response and the usage ledger — sees every token once.

n > 1 resumes only before anything was received (a plain retry): the engine forks its samples
from one prefill and has no per-sample resumption.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loraplex.platform.cluster.messages import GenerateRequest

if TYPE_CHECKING:
    from loraplex.engine import RequestOutput


@dataclass
class _Choice:
    tokens: list[int] = field(default_factory=list)  # token ids received
    chars: int = 0  # characters of text received
    finished: bool = False
    skip_tokens: int = 0  # still to drop from a resumed replica's replay
    skip_chars: int = 0


class StreamCheckpoint:
    def __init__(self, n: int, max_tokens: int) -> None:
        self.n = n
        self.max_tokens = max_tokens
        self._choices = {i: _Choice() for i in range(n)}

    @property
    def received(self) -> bool:
        """Anything reached the reader (a token, text, or a finished choice)."""
        return any(c.tokens or c.chars or c.finished for c in self._choices.values())

    def num_tokens(self, index: int = 0) -> int:
        return len(self._choices[index].tokens)

    def not_resumable(self) -> str | None:
        """Why the request cannot continue elsewhere, or None."""
        if self.n > 1 and self.received:
            return "a request with n > 1 resumes only before its first token"
        return None

    def complete(self) -> bool:
        """The reader has all ``max_tokens`` tokens already: only the finish is missing."""
        return self.n == 1 and self.num_tokens() >= self.max_tokens

    def request(self, req: GenerateRequest, send: int) -> GenerateRequest:
        """The request for the ``send``-th call (0: the request as admitted). A later call gets
        its own engine request id (the lost replica may still hold the old one, if it only stalled)
        and, once tokens were received, the checkpoint to resume from."""
        if send == 0:
            return req
        for c in self._choices.values():
            c.skip_tokens, c.skip_chars = len(c.tokens), c.chars
        resume = list(self._choices[0].tokens) if self.n == 1 and self._choices[0].tokens else None
        return dataclasses.replace(req, request_id=f"{req.request_id}.r{send}", resume_token_ids=resume)

    def record(self, out: RequestOutput, request_id: str) -> RequestOutput:
        """Drop what the reader already has from a (resumed) replica's output, count the rest as
        received, and name the request as the reader knows it."""
        out.request_id = request_id
        for comp in out.outputs:
            c = self._choices.get(comp.index)
            if c is None:
                continue
            if c.skip_tokens:
                drop = min(c.skip_tokens, len(comp.token_ids))
                comp.token_ids = comp.token_ids[drop:]
                if comp.logprobs is not None:
                    comp.logprobs = comp.logprobs[drop:]
                c.skip_tokens -= drop
            if c.skip_chars:
                drop = min(c.skip_chars, len(comp.text))
                comp.text = comp.text[drop:]
                c.skip_chars -= drop
            c.tokens.extend(comp.token_ids)
            c.chars += len(comp.text)
            c.finished = c.finished or comp.finish_reason is not None
        return out

    def finished_by_length(self, request_id: str, prompt_ids: list[int]) -> RequestOutput:
        """The last output of a request whose reader already holds all ``max_tokens`` tokens: the
        replica died between the last token and its finish."""
        from loraplex.engine import CompletionOutput, FinishReason, OutputKind, RequestOutput

        outs = [CompletionOutput(0, [], "", FinishReason.LENGTH)]
        return RequestOutput(request_id, prompt_ids, outs, True, kind=OutputKind.DELTA)
