"""The Responses API request body: honoured fields, and the ones refused with a 400 naming them."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.metadata_limits import check_metadata
from loraplex.platform.inference.openai_schemas import (
    MAX_PROMPT_CACHE_KEY_CHARS,
    MAX_SAFETY_IDENTIFIER_CHARS,
    MAX_TOOLS,
    MAX_USER_CHARS,
    MaxTokens,
    NullIsDefault,
    Temperature,
    TopP,
    count_message_items,
)

# Output-changing features this server does not have: refused, never silently ignored.
UNSUPPORTED = {
    "background": "background responses are not supported",
    "conversation": "conversations are not supported; use previous_response_id",
    "prompt": "stored prompt templates are not supported",
    "top_logprobs": "logprobs are not returned by /v1/responses (use /v1/chat/completions)",
    "max_tool_calls": "max_tool_calls is not supported",
}


# A stored response keeps its text.format: its JSON is bounded here (the grammar's own bound
# applies when it is compiled). OpenAI's largest schemas (5,000 properties, 120,000 characters of
# names and enum values) fit.
MAX_TEXT_FORMAT_CHARS = 256 * 1024

# OpenAI's ResponseIncludable values (openai-python): nothing here returns them, they are accepted
# and ignored; anything else is a 400, as OpenAI answers (the list was unbounded).
Includable = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
]
MAX_INCLUDE = 8  # each known value once


class TextFormat(NullIsDefault):
    # OpenAI's fields only: anything else would be stored with the response unbounded (400).
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(NullIsDefault):
    model_config = ConfigDict(extra="forbid")
    format: TextFormat = Field(default_factory=TextFormat)
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted and ignored (one verbosity)


class ResponsesRequest(NullIsDefault):
    model_config = ConfigDict(extra="allow")

    model: Annotated[str, Field(min_length=1)]
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    stream: bool = False
    store: bool = True
    previous_response_id: Annotated[str, Field(max_length=64)] | None = None
    metadata: dict[str, Any] | None = None  # checked in ``check`` (OpenAI's limits, one 400 naming it)
    user: Annotated[str, Field(max_length=MAX_USER_CHARS)] | None = None
    safety_identifier: Annotated[str, Field(max_length=MAX_SAFETY_IDENTIFIER_CHARS)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=MAX_PROMPT_CACHE_KEY_CHARS)] | None = None  # accepted, unused
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    include: Annotated[list[Includable], Field(max_length=MAX_INCLUDE)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _bounded_input(cls, data: Any) -> Any:
        if isinstance(data, dict):
            count_message_items(data.get("input"), "input")
        return data

    def check(self) -> None:
        check_metadata(self.metadata)
        if self.text is not None:
            size = len(json.dumps(self.text.format.model_dump(by_alias=True, exclude_none=True), ensure_ascii=False))
            if size > MAX_TEXT_FORMAT_CHARS:
                raise BadRequest(
                    f"text.format is {size} characters of JSON; at most {MAX_TEXT_FORMAT_CHARS} are allowed",
                    param="text.format",
                    code="string_above_max_length",
                )
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value not in (None, False, 0):
                raise BadRequest(f"{name}: {UNSUPPORTED[name]}", param=name, code="unsupported_parameter")
        if self.reasoning and self.reasoning.get("effort") not in (None, "none"):
            raise BadRequest(
                "reasoning effort is not supported by this model", param="reasoning", code="unsupported_parameter"
            )
