"""What the engine hands back: one RequestOutput per request, one CompletionOutput per sample."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class FinishReason(str, enum.Enum):
    """Why a sample ended. A ``str`` enum, so it compares and serialises as its OpenAI name."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # the caller aborted (client gone, tenant suspended, shutdown)
    ERROR = "error"  # the engine could not serve it (see RequestOutput.error)

    def __str__(self) -> str:
        return self.value


class OutputKind(enum.Enum):
    """How much each output carries. The server streams DELTA (only what is new since the last
    output, no re-copying); ``LLM.generate`` uses FINAL_ONLY; CUMULATIVE is everything so far."""

    CUMULATIVE = "cumulative"
    DELTA = "delta"
    FINAL_ONLY = "final_only"


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]  # all output tokens so far, or only the new ones with OutputKind.DELTA
    text: str  # likewise
    finish_reason: FinishReason | None = None  # None while running
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    logprobs: list | None = None  # sampler.TokenLogprobs per token when the request asked for them

    def merge(self, later: CompletionOutput) -> None:
        """Append a later DELTA of the same sample (a stream that fell behind coalesces them)."""
        self.token_ids = self.token_ids + later.token_ids
        self.text += later.text
        if later.logprobs is not None:
            self.logprobs = (self.logprobs or []) + later.logprobs
        self.finish_reason, self.stop_reason = later.finish_reason, later.stop_reason


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    adapter: str | None = None
    tenant_id: str = "default"
    metrics: dict = field(default_factory=dict)  # arrival/first_token/finish times, cached tokens
    error: str | None = None
    kind: OutputKind = OutputKind.CUMULATIVE
    # prompt_logprobs requests, on the final output: entry p is prompt token p+1's TokenLogprobs
    # (the first prompt token has none), computed on the prompt exactly as the request sent it.
    prompt_logprobs: list | None = None

    # Single-sample conveniences (the common case): out.text, out.token_ids, out.finish_reason.
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.outputs[0].finish_reason

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    def merge(self, later: RequestOutput) -> None:
        """Fold a later DELTA output of the same request into this one."""
        by_index = {o.index: o for o in self.outputs}
        for o in later.outputs:
            if o.index in by_index:
                by_index[o.index].merge(o)
            else:
                self.outputs.append(o)
        self.finished, self.metrics, self.error = later.finished, later.metrics, later.error
        if later.prompt_logprobs is not None:
            self.prompt_logprobs = later.prompt_logprobs
