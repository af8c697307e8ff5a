"""The one place a request's ``max_tokens`` is decided, and the one way a request that cannot fit
the model's context is refused.

``max_tokens_for`` runs once per prompt, after tokenizing (as vLLM's ``get_max_tokens``): a
request that names no limit (chat without ``max_tokens``/``max_completion_tokens``) gets what is
left of the context, as OpenAI and vLLM do; one that names a limit gets it if the prompt and the
limit fit together. Either way, a request that cannot fit is refused here with OpenAI's error:
``code: "context_length_exceeded"``, ``param: "messages"`` (``"prompt"`` for completions) and
OpenAI's wording ("This model's maximum context length is N tokens. However, ..."), the text that
LiteLLM maps to ``ContextWindowExceededError`` and that LangChain (by the code) maps to
``ContextOverflowError``, so their fallbacks fire. The engine repeats its own check on whatever
reaches it (a replica of a smaller context, the KV cache): that is its contract, not a decision.
"""

from __future__ import annotations

from loraplex.platform.errors import BadRequest

# Chat without max_tokens when no engine can say its context length (a scale-out ingress before
# any replica reported): the engine still refuses what does not fit.
DEFAULT_MAX_TOKENS = 256


class ContextLengthExceeded(BadRequest):
    code = "context_length_exceeded"


def _noun(param: str) -> str:
    return "messages" if param == "messages" else "prompt"


def max_tokens_for(requested: int | None, prompt_tokens: int, context: int | None, *, param: str) -> int:
    """The completion's token limit: ``requested``, or what is left of ``context`` when it is None;
    ``ContextLengthExceeded`` when the prompt (and the requested completion) cannot fit."""
    if context is None:
        return requested if requested is not None else DEFAULT_MAX_TOKENS
    noun = _noun(param)
    if prompt_tokens >= context:  # not even one token of answer fits
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, your {noun} resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the {noun}.",
            param=param,
        )
    if requested is None:
        return context - prompt_tokens
    if prompt_tokens + requested > context:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + requested} tokens ({prompt_tokens} in the {noun}, {requested} in the completion). "
            f"Please reduce the length of the {noun} or completion.",
            param=param,
        )
    return requested


def too_many_characters(chars: int, max_chars: int, context: int, *, param: str) -> ContextLengthExceeded:
    """A prompt refused on its length in characters, before tokenizing: it cannot fit whatever it
    says (``max_chars`` is the context times the vocabulary's longest token)."""
    noun = _noun(param)
    return ContextLengthExceeded(
        f"This model's maximum context length is {context} tokens. However, your {noun} resulted in more "
        f"tokens than that ({chars} characters, where at most {max_chars} can fit). "
        f"Please reduce the length of the {noun}.",
        param=param,
    )
