"""Per-request generation settings (vLLM-compatible names, so users already know them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import InvalidRequestError

if TYPE_CHECKING:
    from .config import RequestLimits

MAX_LOGPROBS = 20
STRUCTURED_KINDS = ("json_object", "json_schema", "regex", "grammar", "structural_tag")


@dataclass(frozen=True)
class StructuredOutputSpec:
    """What the output must match. ``value``: the JSON schema text (json_schema), a regex, an EBNF
    grammar, an xgrammar structural tag as JSON text (structural_tag: tagged regions such as tool
    calls, each with its own schema, among free text or beside an answer's schema); empty for
    json_object (any JSON object). Frozen and hashable: it keys the grammar cache.

    A JSON schema is compiled in the key order it was given (xgrammar writes properties in schema
    order: ``{reasoning, answer}`` reasons first). Equality and hashing use a canonical form that
    sorts every key except the property names, so reordering keywords reuses a compiled grammar
    while reordering properties, which changes the output, does not."""

    kind: str
    value: str = field(default="", compare=False)
    key: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _canonical(self.kind, self.value))

    @classmethod
    def json_schema(cls, schema: dict | str) -> StructuredOutputSpec:
        text = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        return cls("json_schema", text)


_ORDERED = ("properties",)  # maps whose key order is part of the output


def _canonical(kind: str, value: str) -> str:
    if kind != "json_schema":
        return value

    def walk(node: object, keep_order: bool = False) -> object:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        items = [(k, walk(v, k in _ORDERED and not keep_order)) for k, v in node.items()]
        if keep_order:  # a properties map: its names in order, each value canonical
            return [[k, walk(v)] for k, v in node.items()]
        return dict(sorted(items))

    try:
        return json.dumps(walk(json.loads(value)), separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        return value  # refused at compile time; the raw text keys the refusal


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
    # vLLM's prompt_logprobs: None, or k >= 0: every prompt token's logprob (and rank) given the
    # tokens before it, plus the k most likely tokens at that position. Such a request bypasses
    # the prefix cache (a cached prefix skips the positions whose logits it needs).
    prompt_logprobs: int | None = None
    structured_output: StructuredOutputSpec | None = None
    speculative: bool = True  # False: this request opts out of the engine's speculative decoding
    # vLLM extensions, applied by the sampler as masks:
    min_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens were generated
    # Token sequences never to generate: the last token of one is masked whenever the output
    # already ends with the rest of it (a one-token word is always masked).
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    allowed_token_ids: list[int] | None = None  # only these may be sampled

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.logit_bias = dict(self.logit_bias or {})
        self.bad_words_token_ids = [list(w) for w in self.bad_words_token_ids or []]
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        self.validate()
        if self.has_masks:  # drafts are checked against the model's distribution, not these masks
            self.speculative = False

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
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int)
            or isinstance(self.prompt_logprobs, bool)
            or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            raise bad(
                f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs!r}",
                "prompt_logprobs",
            )
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            raise bad(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}", "min_tokens")
        if self.min_tokens > self.max_tokens:
            raise bad(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})", "min_tokens")
        for word in self.bad_words_token_ids:
            if not word or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in word):
                raise bad("bad_words must be non-empty token sequences", "bad_words")
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.allowed_token_ids
            ):
                raise bad("allowed_token_ids must be a non-empty list of token ids", "allowed_token_ids")
        so = self.structured_output
        if so is not None and (not isinstance(so, StructuredOutputSpec) or so.kind not in STRUCTURED_KINDS):
            raise bad(
                f"structured_output must be a StructuredOutputSpec of kind {STRUCTURED_KINDS}", "structured_output"
            )

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def has_masks(self) -> bool:
        return self.min_tokens > 0 or bool(self.bad_words_token_ids) or self.allowed_token_ids is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # rejects NaN


def check_request_limits(params: SamplingParams, limits: RequestLimits) -> None:
    """Refuse (400 naming the field) what would make the engine thread do unbounded work for one
    request: every stop string is searched for after every token of every sample, every logit_bias
    entry applied at every step (engine/config.py ``RequestLimits``)."""
    if len(params.stop) > limits.max_stop_strings:
        raise InvalidRequestError(
            f"stop holds {len(params.stop)} strings; at most {limits.max_stop_strings} are allowed", param="stop"
        )
    total = sum(len(s) for s in params.stop)
    if total > limits.max_stop_chars:
        raise InvalidRequestError(
            f"stop strings hold {total} characters in all; at most {limits.max_stop_chars} are allowed", param="stop"
        )
    forms = len(params.bad_words_token_ids)
    if forms > 2 * limits.max_bad_words:  # the platform tokenizes each word in two forms
        raise InvalidRequestError(
            f"bad_words holds {forms} token sequences; at most {2 * limits.max_bad_words} "
            f"(two forms of {limits.max_bad_words} words) are allowed",
            param="bad_words",
        )
    if len(params.logit_bias) > limits.max_logit_bias:
        raise InvalidRequestError(
            f"logit_bias holds {len(params.logit_bias)} entries; at most {limits.max_logit_bias} are allowed",
            param="logit_bias",
        )
