"""Request bodies of the OpenAI-compatible API, and how one becomes the engine's sampling values.

Every field that changes the output is either honoured or refused with a 400 that names it
(``UNSUPPORTED``); fields that cannot change the output (``store``, ``metadata``...) and fields we
do not know are accepted, and an unknown one is logged once per name.

A body turns into the engine's ``SamplingParams`` in one copy, ``to_sampling_params`` (vLLM's
name), once its prompt is tokenized and ``context_window.max_tokens_for`` has decided
``max_tokens``; what needs the tokenizer but not the prompt is checked earlier
(``check_sampling``, before the database is asked anything).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.metadata_limits import check_metadata

if TYPE_CHECKING:
    from loraplex.engine import RequestLimits, SamplingParams

log = logging.getLogger("loraplex.platform.inference")

Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
MaxTokens = Annotated[int, Field(ge=1, le=1_000_000)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
MAX_N = 16
MAX_PROMPTS = 64
MAX_TOOLS = 128  # OpenAI's limit; each tool is part of the grammar of a required tool_choice
# Messages + content parts + tool calls of one chat request (and Responses input items + parts).
MAX_MESSAGE_ITEMS = 4096
# End-user identifiers (written whole to the request log and, ``user``, the usage ledger's 256-character
# column): OpenAI documents safety_identifier <= 64 characters; user and prompt_cache_key get the ledger's 256.
MAX_USER_CHARS = 256
MAX_SAFETY_IDENTIFIER_CHARS = 64
MAX_PROMPT_CACHE_KEY_CHARS = 256
MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds; larger ones would fail inside the engine

# Output-changing parameters loraplex does not implement: refused, never silently ignored.
UNSUPPORTED = {
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "suffix": "suffix (insertion) is not supported",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated `functions` parameter is not supported; use `tools`",
    "function_call": "the deprecated `function_call` parameter is not supported; use `tool_choice`",
    "reasoning_effort": "reasoning effort is not supported by this model",
    "use_beam_search": "beam search is not supported",
    "length_penalty": "length_penalty only applies to beam search, which is not supported",
    "logits_processors": "custom logits processors are not supported",
    "mm_processor_kwargs": "multimodal inputs are not supported",
    "guided_decoding_backend": "the structured-output backend is always xgrammar",
    "guided_whitespace_pattern": "a whitespace pattern is not supported (JSON is generated compact)",
    "return_tokens_as_token_ids": "return_tokens_as_token_ids is not supported",
    "kv_transfer_params": "KV transfer is not supported",
    "vllm_xargs": "vllm_xargs is not supported",
    "skip_special_tokens": "special tokens are always skipped in the output text",
}
# Known and harmless: accepted without a log line.
HARMLESS = {
    "store",
    "metadata",
    "service_tier",
    "stream_options",
    "request_id",
    "spaces_between_special_tokens",
    "echo_prompt",
    "safety_identifier",
    "prompt_cache_key",
    "verbosity",
}
_logged_unknown: set[str] = set()


def check_extra_fields(body: BaseModel) -> None:
    extra = body.model_extra or {}
    for name, value in extra.items():
        if name == "metadata":  # accepted and not stored, but held to OpenAI's limits like /v1/responses
            check_metadata(value)
        if name in UNSUPPORTED:
            if name == "modalities" and value in (["text"], None):
                continue
            if (
                value is None
                or (name == "use_beam_search" and value is False)
                or (name == "skip_special_tokens" and value is True)
            ):
                continue  # an explicit null (or off) asks for nothing
            raise BadRequest(f"{name}: {UNSUPPORTED[name]}", param=name, code="unsupported_parameter")
        if name not in HARMLESS and name not in _logged_unknown:
            _logged_unknown.add(name)
            log.warning("ignoring unknown request field %r (logged once)", name)


def count_message_items(items: Any, param: str) -> None:
    """Refuse a message list over ``MAX_MESSAGE_ITEMS`` (messages + content parts + tool calls)
    on the raw JSON, before pydantic validates it item by item on the event loop: a 4 MiB body of
    one-character messages otherwise held the loop (every tenant's streams) for seconds and ended
    in a 400 anyway. Looks at no more than ``MAX_MESSAGE_ITEMS`` entries, whatever was sent."""
    if not isinstance(items, list):
        return
    total = len(items)
    if total <= MAX_MESSAGE_ITEMS:
        for item in items:
            if isinstance(item, dict):
                for field in ("content", "tool_calls"):
                    inner = item.get(field)
                    if isinstance(inner, list):
                        total += len(inner)
    if total > MAX_MESSAGE_ITEMS:
        raise BadRequest(
            f"{param} holds {total} items (messages, content parts and tool calls); at most "
            f"{MAX_MESSAGE_ITEMS} are allowed",
            param=param,
            code="array_above_max_length",
        )


def count_prompts(prompt: Any) -> None:
    """The prompt list's bound, on the raw JSON before validation: the ``Prompt`` union walks a
    list once per member it tries and builds an error per item of every member that fails, so
    800,000 one-token lists held the event loop for seconds before ``MAX_PROMPTS`` applied."""
    if not isinstance(prompt, list) or not prompt:
        return
    if isinstance(prompt[0], (str, list)):
        if len(prompt) > MAX_PROMPTS:
            raise BadRequest(
                f"the prompt list holds {len(prompt)} prompts; at most {MAX_PROMPTS} per request", param="prompt"
            )
    elif not all(isinstance(x, int) for x in prompt):  # one token-id prompt: nothing but ids
        raise BadRequest("a prompt of token ids must hold only token ids (integers)", param="prompt")


class NullIsDefault(BaseModel):
    """An explicit ``null`` means "the default" (OpenAI and vLLM accept ``"temperature": null``):
    nulls of fields that have a non-null default are dropped before validation."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, f in cls.model_fields.items():
            key = f.alias or name
            if out.get(key, 0) is None and not f.is_required() and f.default is not None:
                del out[key]
        return out


class StreamOptions(NullIsDefault):
    include_usage: bool = False


class JSONSchemaFormat(NullIsDefault):
    model_config = ConfigDict(extra="allow")
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(NullIsDefault):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputs(NullIsDefault):
    """vLLM's ``structured_outputs`` (exactly one of its constraints)."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1, max_length=1024)] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None


class _Common(NullIsDefault):
    model_config = ConfigDict(extra="allow")

    model: Annotated[str, Field(min_length=1)]
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    user: Annotated[str, Field(max_length=MAX_USER_CHARS)] | None = None
    safety_identifier: Annotated[str, Field(max_length=MAX_SAFETY_IDENTIFIER_CHARS)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=MAX_PROMPT_CACHE_KEY_CHARS)] | None = None  # accepted, unused
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    # vLLM extensions
    repetition_penalty: Annotated[float, Field(gt=0, le=10)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    ignore_eos: bool = False
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1, max_length=1024)] | None = None
    structured_outputs: StructuredOutputs | None = None
    min_tokens: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    # Bounded in words and characters by the engine's RequestLimits (check_sampling, before tokenizing).
    bad_words: list[Annotated[str, Field(min_length=1)]] | None = None
    allowed_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=262_144)] | None = (
        None
    )
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Annotated[int, Field(ge=1)] | None = None
    priority: int = 0
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    _bad_words_ids: tuple[tuple[int, ...], ...] | None = PrivateAttr(default=None)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def bias(self) -> dict[int, float]:
        out = {}
        for k, v in (self.logit_bias or {}).items():
            try:
                out[int(k)] = float(v)
            except ValueError:
                raise BadRequest(
                    f"logit_bias keys must be token ids, got {k!r}", param="logit_bias", code="invalid_value"
                ) from None
        return out

    # -- what the endpoint asks of the sampler (chat and completions name these differently) ------
    def requested_max_tokens(self) -> int | None:
        """None: what is left of the context (chat's default; decided by ``context_window``)."""
        raise NotImplementedError

    def sample_logprobs(self) -> int | None:
        """Top-k of each generated token; None: no logprobs."""
        raise NotImplementedError

    def sample_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    # -- the conversion ----------------------------------------------------------------------------
    def check_sampling(self, tokenizer: Any, limits: RequestLimits | None = None) -> None:
        """What pydantic cannot check alone: token ids against the tokenizer's vocabulary (the
        model's embedding may have more rows, ids that decode to no text: a logit_bias on one made
        the answer empty), the bounds of ``limits`` on what is tokenized here (``bad_words``) and
        fields loraplex refuses. 400s naming the field; nothing is copied."""
        if limits is not None:
            check_bad_words(self.bad_words or [], limits)
        if self.priority != 0:
            raise BadRequest(
                "per-request priority is not supported (a tenant's priority is set by the operator)",
                param="priority",
                code="unsupported_parameter",
            )
        vocab = len(tokenizer)
        for name, ids in (
            ("allowed_token_ids", self.allowed_token_ids or []),
            ("stop_token_ids", self.stop_token_ids or []),
            ("logit_bias", list(self.bias())),
        ):
            if any(t >= vocab for t in ids):
                raise BadRequest(
                    f"{name} holds a token id outside the vocabulary [0, {vocab})", param=name, code="invalid_value"
                )

    def to_sampling_params(
        self, tokenizer: Any, *, max_tokens: int, structured_output: tuple[str, str] | None
    ) -> SamplingParams:
        """The engine's ``SamplingParams`` for this body, field by field (the only copy), with the
        ``max_tokens`` that ``context_window.max_tokens_for`` decided and the output constraint
        (``(kind, value)``) of the response format or the tool plan; its grammar is compiled by the
        engine client (``check_sampling``). The engine's own checks become 400s naming the field."""
        from loraplex.engine import InvalidRequestError, SamplingParams, StructuredOutputSpec

        so = structured_output
        try:
            return SamplingParams(
                n=self.n,
                max_tokens=max_tokens,
                temperature=self.temperature,
                top_k=self.top_k,
                top_p=self.top_p,
                seed=self.seed,
                stop=self.stop_list(),
                stop_token_ids=list(self.stop_token_ids or ()),
                ignore_eos=self.ignore_eos,
                include_stop_str_in_output=self.include_stop_str_in_output,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                repetition_penalty=self.repetition_penalty,
                min_p=self.min_p,
                logit_bias=self.bias(),
                logprobs=self.sample_logprobs(),
                prompt_logprobs=self.sample_prompt_logprobs(),
                structured_output=StructuredOutputSpec(so[0], so[1]) if so is not None else None,
                min_tokens=self.min_tokens,
                bad_words_token_ids=[list(w) for w in self._bad_words(tokenizer)],
                allowed_token_ids=list(self.allowed_token_ids) if self.allowed_token_ids is not None else None,
            )
        except InvalidRequestError as exc:
            raise BadRequest(str(exc), param=exc.param, code="invalid_value") from None

    def _bad_words(self, tokenizer: Any) -> tuple[tuple[int, ...], ...]:
        # Tokenized once per body, however many prompts a completions request carries.
        if self._bad_words_ids is None:
            self._bad_words_ids = bad_words_token_ids(self.bad_words or [], tokenizer)
        return self._bad_words_ids


def check_bad_words(words: list[str], limits: RequestLimits) -> None:
    """``bad_words`` within ``limits`` (words, characters of all words), before any is tokenized:
    each becomes two token sequences whose last tokens the engine may mask at every step."""
    if len(words) > limits.max_bad_words:
        raise BadRequest(
            f"bad_words holds {len(words)} words; at most {limits.max_bad_words} are allowed",
            param="bad_words",
            code="array_above_max_length",
        )
    total = sum(len(w) for w in words)
    if total > limits.max_bad_words_chars:
        raise BadRequest(
            f"bad_words hold {total} characters in all; at most {limits.max_bad_words_chars} are allowed",
            param="bad_words",
            code="invalid_value",
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


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_Common):
    prompt: Prompt
    max_tokens: MaxTokens = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False
    best_of: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _bounded_prompts(cls, data: Any) -> Any:
        if isinstance(data, dict):
            count_prompts(data.get("prompt"))
        return data

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sample_logprobs(self) -> int | None:
        return self.logprobs

    def sample_prompt_logprobs(self) -> int | None:
        # echo + logprobs: the prompt's own logprobs (top-k as the completion's), computed with any
        # prompt_logprobs the request also asked for (each is cut to its own k when rendered).
        if self.echo and self.logprobs is not None:
            return max(self.prompt_logprobs or 0, self.logprobs)
        return self.prompt_logprobs

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            items: list[str | list[int]] = [p]
        elif p and all(isinstance(x, int) for x in p):
            items = [list(p)]  # type: ignore[arg-type]
        else:
            items = list(p)  # type: ignore[arg-type]
        if not items:
            raise BadRequest("prompt is empty", param="prompt")
        if len(items) > MAX_PROMPTS:
            raise BadRequest(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
        return items


class TextPart(NullIsDefault):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCall(NullIsDefault):
    name: str
    arguments: str = "{}"


class ToolCall(NullIsDefault):
    model_config = ConfigDict(extra="allow")
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(NullIsDefault):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


# OpenAI's rule for a function's name, ``^[a-zA-Z0-9_-]{1,64}$`` (its API answers 400 to anything
# else: over 64 characters as ``string_above_max_length``, other characters as ``invalid_value``).
# Held here because a name is spliced into the chat template and the tool grammar: "</tool_call>",
# quotes, braces or a NUL in a name are what the hostile rounds sent. Rust's regex (pydantic's)
# anchors ``$`` at the very end, so "a\n" does not slip through as Python's ``re.match`` lets it.
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]


class FunctionDef(NullIsDefault):
    model_config = ConfigDict(extra="allow")
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # TOOL_NAME_PATTERN for fullmatch (no "$" before a newline)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: dict[str, str]

    @field_validator("function")
    @classmethod
    def _has_name(cls, v: dict[str, str]) -> dict[str, str]:
        if not v.get("name"):
            raise ValueError("tool_choice.function.name is required")
        if not TOOL_NAME_RE.fullmatch(v["name"]):
            raise ValueError(f"tool_choice.function.name must match the pattern '{TOOL_NAME_PATTERN}'")
        return v


class ChatRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # vLLM's chat-template controls
    chat_template: Annotated[str, Field(max_length=256 * 1024)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # vLLM's RAG documents: a template variable (a template that does not use them ignores them).
    documents: Annotated[list[dict[str, str]], Field(max_length=1024)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _bounded_messages(cls, data: Any) -> Any:
        if isinstance(data, dict):
            count_message_items(data.get("messages"), "messages")
        return data

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def sample_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
