"""The OpenAI response bodies loraplex sends, as pydantic models.

``Wire.dump()`` gives the dict that goes on the wire (``json.dumps`` of it, unchanged from the
hand-built dicts these replace): a field listed in ``omit_when_none`` is left out while it is None
(OpenAI omits ``tool_calls`` of a message without calls, a delta's unset parts), one in
``omit_when_unset`` is left out unless it was given (vLLM's ``prompt_logprobs`` appears, possibly
null, only when the request asked for it); every other field is sent, nulls included (clients read
``"logprobs": null`` and ``"content": null``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, model_serializer


class Wire(BaseModel):
    model_config = ConfigDict(frozen=True)
    omit_when_none: ClassVar[frozenset[str]] = frozenset()
    omit_when_unset: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit(self, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for name in self.omit_when_none:
            if out.get(name, 0) is None:
                del out[name]
        for name in self.omit_when_unset - self.model_fields_set:
            out.pop(name, None)
        return out

    def dump(self) -> dict[str, Any]:
        return self.model_dump()


class Usage(Wire):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


# -- logprobs ------------------------------------------------------------------------------------
class TopLogprob(Wire):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(Wire):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Wire):
    content: list[TokenLogprob]
    refusal: None = None


class CompletionLogprobs(Wire):
    """Legacy completions' parallel lists (an echoed prompt's first token: null logprob and top)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(Wire):
    logprob: float
    rank: int | None
    decoded_token: str


PromptLogprobs = list[dict[str, PromptLogprob] | None]  # vLLM's: entry 0 is null


# -- chat ----------------------------------------------------------------------------------------
class FunctionDelta(Wire):
    omit_when_none = frozenset({"name", "arguments"})
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Wire):
    """A streamed tool call's piece: the first has id, type and name; later ones arguments only."""

    omit_when_none = frozenset({"id", "type"})
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class FunctionCall(Wire):
    name: str
    arguments: str


class ToolCall(Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Wire):
    omit_when_none = frozenset({"tool_calls"})
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(Wire):
    index: int
    message: ChatMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(Wire):
    omit_when_unset = frozenset({"prompt_logprobs"})
    id: str
    created: int
    model: str
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None  # which backend configuration answered (fingerprint.py)
    prompt_logprobs: PromptLogprobs | None = None  # vLLM: the chat prompt's, when asked


class ChatDelta(Wire):
    omit_when_none = frozenset({"role", "content", "tool_calls"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Wire):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatChunk(Wire):
    id: str
    created: int
    model: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    system_fingerprint: str | None = None
    usage: Usage | None = None
    omit_when_none = frozenset({"usage"})


# -- legacy completions --------------------------------------------------------------------------
class CompletionChoice(Wire):
    omit_when_unset = frozenset({"prompt_logprobs"})
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None  # vLLM: per choice, when asked


class Completion(Wire):
    id: str
    created: int
    model: str
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    system_fingerprint: str | None = None
    usage: Usage


class CompletionChunkChoice(Wire):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionChunk(Wire):
    omit_when_none = frozenset({"usage"})
    id: str
    created: int
    model: str
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChunkChoice]
    system_fingerprint: str | None = None
    usage: Usage | None = None
