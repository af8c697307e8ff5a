"""The Responses API request body: honoured fields, and the ones refused with a 400 naming them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import MAX_TOOLS, MaxTokens, NullIsDefault, Temperature, TopP

# Output-changing features this server does not have: refused, never silently ignored.
UNSUPPORTED = {
    "background": "background responses are not supported",
    "conversation": "conversations are not supported; use previous_response_id",
    "prompt": "stored prompt templates are not supported",
    "top_logprobs": "logprobs are not returned by /v1/responses (use /v1/chat/completions)",
    "max_tool_calls": "max_tool_calls is not supported",
}


class TextFormat(NullIsDefault):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(NullIsDefault):
    model_config = ConfigDict(extra="allow")
    format: TextFormat = Field(default_factory=TextFormat)


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
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    include: list[str] | None = None

    def check(self) -> None:
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value not in (None, False, 0):
                raise BadRequest(f"{name}: {UNSUPPORTED[name]}", param=name, code="unsupported_parameter")
        if self.reasoning and self.reasoning.get("effort") not in (None, "none"):
            raise BadRequest(
                "reasoning effort is not supported by this model", param="reasoning", code="unsupported_parameter"
            )
