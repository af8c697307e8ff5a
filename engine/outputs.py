"""What the engine hands back: one RequestOutput per request, one CompletionOutput per sample."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    logprobs: list | None = None  # sampler.TokenLogprobs per token when the request asked for them


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

    # Single-sample conveniences (the common case): out.text, out.token_ids, out.finish_reason.
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)
