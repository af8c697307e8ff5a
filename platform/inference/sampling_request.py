"""What a request asks of the sampler, built once from its body: ``SamplingRequest``.

Every platform-side check of the sampling fields (400s) happens in ``from_body``; the pydantic
schema has already bounded each field alone, and the engine's ``SamplingParams`` repeats its own
checks on whatever reaches it. The value is frozen: admission fills in chat's default
``max_tokens`` with ``dataclasses.replace`` once the prompt length is known, and the gateway turns
it into the engine's ``SamplingParams`` (compiling the structured-output grammar) field by field.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from loraplex.platform.errors import BadRequest

if TYPE_CHECKING:
    from loraplex.platform.inference.openai_schemas import _Common

MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds; larger ones would fail inside the engine


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """The engine-facing sampling values of one request (all its prompts share them)."""

    max_tokens: int | None  # None: chat's default, what is left of the context (set at admission)
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs: a frozen mapping
    logprobs: int | None = None  # top-k of each generated token; None: no logprobs
    prompt_logprobs: int | None = None  # top-k of each prompt position (vLLM; echo + logprobs)
    structured_output: tuple[str, str] | None = None  # (kind, value): compiled by the gateway
    min_tokens: int = 0
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    # Whose grammar compilation this is (bounded and charged per tenant; set at admission).
    tenant_id: str | None = None

    def with_max_tokens(self, max_tokens: int) -> SamplingRequest:
        return replace(self, max_tokens=max_tokens)

    @classmethod
    def from_body(
        cls,
        body: _Common,
        tokenizer: Any,
        *,
        max_tokens: int | None,
        logprobs: int | None,
        structured_output: tuple[str, str] | None,
        prompt_logprobs: int | None = None,
    ) -> SamplingRequest:
        """The body's sampling fields, checked against the tokenizer (400s naming the field)."""
        if body.priority != 0:
            raise BadRequest(
                "per-request priority is not supported (a tenant's priority is set by the operator)",
                param="priority",
                code="unsupported_parameter",
            )
        if body.seed is not None and not 0 <= body.seed <= MAX_SEED:
            raise BadRequest(f"seed must be in [0, {MAX_SEED}]", param="seed", code="invalid_value")
        bias = body.bias()
        # The tokenizer's vocabulary, for every token-id field: the model's embedding may have more
        # rows (padding), ids that decode to no text (a logit_bias on one made the answer empty).
        vocab = len(tokenizer)
        for name, ids in (
            ("allowed_token_ids", body.allowed_token_ids or []),
            ("stop_token_ids", body.stop_token_ids or []),
            ("logit_bias", list(bias)),
        ):
            if any(t >= vocab for t in ids):
                raise BadRequest(f"{name} holds a token id outside the vocabulary [0, {vocab})", param=name)
        return cls(
            max_tokens=max_tokens,
            n=body.n,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            min_p=body.min_p,
            seed=body.seed,
            stop=tuple(body.stop_list()),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            include_stop_str_in_output=body.include_stop_str_in_output,
            ignore_eos=body.ignore_eos,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty,
            logit_bias=tuple(bias.items()),
            logprobs=logprobs,
            prompt_logprobs=body.prompt_logprobs if prompt_logprobs is None else prompt_logprobs,
            structured_output=structured_output,
            min_tokens=body.min_tokens,
            bad_words_token_ids=bad_words_token_ids(body.bad_words or [], tokenizer),
            allowed_token_ids=tuple(body.allowed_token_ids) if body.allowed_token_ids is not None else None,
        )


def bad_words_token_ids(words: list[str], tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """As vLLM: each word's tokens alone and after a space (the forms it takes mid-sentence)."""
    out: list[tuple[int, ...]] = []
    for w in words:
        for form in (w, " " + w.lstrip()):
            ids = tuple(tokenizer.encode(form, add_special_tokens=False))
            if ids and ids not in out:
                out.append(ids)
    return tuple(out)
