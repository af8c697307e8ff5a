"""Per-request generation settings (vLLM-compatible names, so users already know them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .errors import InvalidRequestError

MAX_LOGPROBS = 20
STRUCTURED_KINDS = ("json_object", "json_schema", "regex", "grammar")


@dataclass(frozen=True)
class StructuredOutputSpec:
    """What the output must match. ``value``: the JSON schema text (json_schema), a regex, an EBNF
    grammar; empty for json_object (any JSON object). Frozen and hashable: it keys the grammar cache."""

    kind: str
    value: str = ""

    @classmethod
    def json_schema(cls, schema: dict | str) -> StructuredOutputSpec:
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        return cls("json_schema", text)


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
    # penalties (OpenAI / vLLM semantics): presence and frequency act on the tokens generated so
    # far; repetition (CTRL-style, divides positive logits) on prompt and generated tokens.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    # None: no logprobs; k >= 0: the sampled token's logprob plus the k most likely tokens'.
    logprobs: int | None = None
    structured_output: StructuredOutputSpec | None = None
    speculative: bool = True  # False: this request opts out of the engine's speculative decoding

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.logit_bias = dict(self.logit_bias or {})
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

        for name, lo, hi in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0), ("min_p", 0.0, 1.0)):
            v = getattr(self, name)
            if not _is_number(v) or not lo <= v <= hi:
                raise bad(f"{name} must be a number in [{lo}, {hi}], got {v!r}", name)
        if not _is_number(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 10.0:
            raise bad(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty!r}", "repetition_penalty")
        for t, b in self.logit_bias.items():
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise bad(f"logit_bias keys must be token ids (non-negative integers), got {t!r}", "logit_bias")
            if not _is_number(b) or not -100.0 <= b <= 100.0:
                raise bad(f"logit_bias values must be in [-100, 100], got {b!r}", "logit_bias")
        if self.logprobs is not None and (
            not isinstance(self.logprobs, int)
            or isinstance(self.logprobs, bool)
            or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise bad(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}", "logprobs")
        so = self.structured_output
        if so is not None and (not isinstance(so, StructuredOutputSpec) or so.kind not in STRUCTURED_KINDS):
            raise bad(
                f"structured_output must be a StructuredOutputSpec of kind {STRUCTURED_KINDS}", "structured_output"
            )

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # rejects NaN
