"""Chat messages and tools: what goes into the chat template, what constrains the output, and how
the output becomes ``message.tool_calls``.

``tool_choice``:
- ``none``: plain text; tools are still shown to the template (the model knows they exist).
- ``auto`` (the default with tools): the template's own tool format; calls are read back from the
  Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks the output holds.
- ``required``: the output is constrained to ``{"name": <one of the tools>, "arguments": <its
  parameters schema>}`` (one call).
- a named function: the output is constrained to that function's parameters schema; it IS the
  arguments, so they stream as they are generated.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import ChatRequest, NamedToolChoice
from loraplex.platform.inference.structured import Spec, schema_text

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class ToolPlan:
    mode: str = "none"  # none | auto | required | named
    name: str | None = None  # the named function
    spec: Spec | None = None
    template_tools: list[dict[str, Any]] | None = None


@dataclass
class ToolCallOut:
    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def plan_tools(body: ChatRequest) -> ToolPlan:
    tools = body.tools or []
    choice = body.tool_choice
    if choice is not None and choice != "none" and not tools:
        raise BadRequest("tool_choice needs tools", param="tool_choice")
    if not tools:
        return ToolPlan()
    funcs = {t.function.name: t.function for t in tools}
    template_tools = [t.model_dump(exclude_none=True) for t in tools]
    mode = "auto" if choice is None else ("named" if isinstance(choice, NamedToolChoice) else choice)
    if mode in ("required", "named") and body.response_format is not None and body.response_format.type != "text":
        raise BadRequest(
            "response_format cannot be combined with a required or named tool_choice", param="response_format"
        )
    if mode == "named":
        assert isinstance(choice, NamedToolChoice)
        name = choice.function["name"]
        if name not in funcs:
            raise BadRequest(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        return ToolPlan(
            "named", name, ("json_schema", schema_text(funcs[name].parameters or ANY_OBJECT)), template_tools
        )
    if mode == "required":
        options = [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "arguments"],
                "properties": {"name": {"const": n}, "arguments": f.parameters or ANY_OBJECT},
            }
            for n, f in funcs.items()
        ]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return ToolPlan("required", None, ("json_schema", schema_text(schema)), template_tools)
    return ToolPlan(mode, None, None, template_tools)


def template_messages(body: ChatRequest, template: str) -> list[dict[str, Any]]:
    """Messages as the chat template expects them; refuses content parts that are not text."""
    knows_tool_calls = "tool_calls" in (template or "")
    out = []
    for i, m in enumerate(body.messages):
        if isinstance(m.content, list):
            texts = []
            for j, part in enumerate(m.content):
                if part.type != "text" or part.text is None:
                    raise BadRequest(
                        f"content parts of type {part.type!r} are not supported (text only)",
                        param=f"messages[{i}].content[{j}].type",
                        code="unsupported_parameter",
                    )
                texts.append(part.text)
            content = "".join(texts)
        else:
            content = m.content or ""
        msg: dict[str, Any] = {"role": m.role, "content": content}
        if m.name:
            msg["name"] = m.name
        if m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id or ""
        if m.tool_calls:
            calls = [{"name": c.function.name, "arguments": _loads_or_text(c.function.arguments)} for c in m.tool_calls]
            if knows_tool_calls:
                msg["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": f} for c, f in zip(m.tool_calls, calls)
                ]
            else:  # a template without tool support still sees what was called, in Hermes form
                msg["content"] = content + "".join(f"<tool_call>{json.dumps(f)}</tool_call>" for f in calls)
        out.append(msg)
    return out


def _loads_or_text(s: str) -> Any:
    try:
        return json.loads(s)
    except ValueError:
        return s


def parse_output(plan: ToolPlan, text: str) -> tuple[str | None, list[ToolCallOut]]:
    """(content, tool calls) of a finished choice."""
    if plan.mode == "named":
        return None, [ToolCallOut(plan.name or "", text)]
    if plan.mode == "required":
        try:
            obj = json.loads(text)
            return None, [ToolCallOut(obj["name"], json.dumps(obj["arguments"]))]
        except (ValueError, KeyError, TypeError):  # cut off by max_tokens: give the text back
            return text, []
    if plan.mode == "auto":
        calls = []
        for m in _TOOL_CALL.finditer(text):
            try:
                obj = json.loads(m.group(1))
                calls.append(ToolCallOut(str(obj["name"]), json.dumps(obj.get("arguments", {}))))
            except (ValueError, KeyError, TypeError):
                continue
        if calls:
            rest = _TOOL_CALL.sub("", text).strip()
            return rest or None, calls
    return text, []


def finish_reason(reason: str | None, calls: list[ToolCallOut]) -> str | None:
    return "tool_calls" if calls and reason == "stop" else reason


class ToolStream:
    """One choice's streaming deltas: named calls stream their arguments; required/auto buffer
    the text until the choice finishes (a call is only known once it parses); none passes text."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self._buf: list[str] = []
        self._call = ToolCallOut(plan.name or "", "") if plan.mode == "named" else None
        self._started = False

    def delta(self, text: str, reason: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """(delta or None, finish_reason) for new ``text`` (``reason`` set on the last one)."""
        mode = self.plan.mode
        if mode == "none":
            return ({"content": text} if text else None), reason
        if mode == "named":
            assert self._call is not None
            fn: dict[str, Any] = {"arguments": text}
            call: dict[str, Any] = {"index": 0, "function": fn}
            if not self._started:
                self._started = True
                call.update(id=self._call.id, type="function")
                fn["name"] = self._call.name
            elif not text:
                return None, ("tool_calls" if reason == "stop" else reason)
            return {"tool_calls": [call]}, ("tool_calls" if reason == "stop" else reason)
        self._buf.append(text)
        if reason is None:
            return None, None
        content, calls = parse_output(self.plan, "".join(self._buf))
        d: dict[str, Any] = {}
        if content:
            d["content"] = content
        if calls:
            d["tool_calls"] = [{"index": k, **c.as_dict()} for k, c in enumerate(calls)]
        return (d or None), finish_reason(reason, calls)
