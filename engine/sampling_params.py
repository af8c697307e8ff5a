"""Per-request generation settings (vLLM-compatible names, so users already know them)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import InvalidRequestError


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = -1  # -1 or 0: disabled
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    speculative: bool = True  # False: this request opts out of the engine's speculative decoding

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        def bad(msg: str, param: str) -> InvalidRequestError:
            return InvalidRequestError(msg, param=param)

        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise bad(f"n must be an integer >= 1, got {self.n!r}", "n")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}", "max_tokens")
        if not _is_number(self.temperature) or not (0.0 <= self.temperature <= 100.0):
            raise bad(f"temperature must be a number in [0, 100], got {self.temperature!r}", "temperature")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            raise bad(f"top_k must be -1 (disabled) or an integer >= 0, got {self.top_k!r}", "top_k")
        if not _is_number(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise bad(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise bad(f"seed must be an integer, got {self.seed!r}", "seed")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise bad(f"stop strings must be non-empty strings, got {s!r}", "stop")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise bad(f"stop_token_ids must be non-negative integers, got {t!r}", "stop_token_ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # rejects NaN
