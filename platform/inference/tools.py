"""Chat messages and tools: what goes into the chat template, what constrains the output, and how
the output becomes ``message.tool_calls``.

``tool_choice``:
- ``none``: plain text; tools are still shown to the template (the model knows they exist). An
  answer constraint (``response_format``, ``guided_*``) applies as it does without tools.
- ``auto`` (the default with tools): the template's own tool format; calls are read back by the
  served model's tool-call parser (``[openai] tool_call_parser``: hermes, llama3_json, mistral,
  pythonic), streaming as they are written. What names a tool the request did not offer is not a
  call: it stays text (``content``), as OpenAI never returns such a call. For hermes and
  llama3_json a grammar in that format (tool_grammar.py) makes every call the model starts a call
  to an offered tool with valid arguments; beside a JSON answer constraint (``response_format``,
  ``guided_json``) it is a call OR the answer. ``guided_regex`` / ``guided_grammar`` shape the
  whole output, calls included (as in vLLM).
- ``required``: calls only. hermes / llama3_json: one or more calls in the model's own format,
  which may end after every complete call (tool_grammar.py); other formats: a JSON array of one or
  more ``{"name": <one of the tools>, "arguments": <its parameters schema>}`` objects, ``name``
  first so the model picks the tool before it writes the arguments. ``parallel_tool_calls: false``:
  exactly one call. An answer constraint is ignored (the answer is the calls).
- a named function: the output is constrained to that function's parameters schema; it IS the
  arguments, so they stream as they are generated (finish_reason ``stop``, as OpenAI answers).
  An answer constraint is ignored, as with ``required``.

Identical calls (same name, same arguments) repeated in one answer are read back once.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import ChatRequest, NamedToolChoice
from loraplex.platform.inference.structured import Spec, schema_text
from loraplex.platform.inference.tool_grammar import tool_grammar
from loraplex.platform.inference.tool_parsers import (
    JsonCallsParser,
    NamedArgumentsParser,
    PartialCall,
    ToolParser,
    get_parser,
)

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass
class ToolPlan:
    mode: str = "none"  # none | auto | required | named
    name: str | None = None  # the named function
    spec: Spec | None = None
    template_tools: list[dict[str, Any]] | None = None
    parser: ToolParser | None = None  # reads the calls back (None: plain text)
    parallel: bool = True  # more than one call per answer allowed
    # The answer's JSON schema (response_format / guided_json beside tools): the chat template gets
    # it as ``response_schema``, so a model can see what its final answer must look like
    answer_schema: dict[str, Any] | None = None


@dataclass
class ToolCallOut:
    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def plan_tools(body: ChatRequest, parser: str = "hermes", answer: Spec | None = None) -> ToolPlan:
    """How ``body``'s tools shape the output; ``answer``: its other output constraint
    (``response_format`` / ``guided_*``). The plan's ``spec`` is the request's whole constraint."""
    plan = _plan(body, parser, answer)
    if plan.template_tools and answer is not None and answer[0] == "json_schema":
        try:
            schema = json.loads(answer[1])
        except ValueError:
            schema = None
        plan.answer_schema = schema if isinstance(schema, dict) else None
    return plan


def _plan(body: ChatRequest, parser: str, answer: Spec | None) -> ToolPlan:
    tools = body.tools or []
    choice = body.tool_choice
    if choice is not None and choice != "none" and not tools:
        raise BadRequest("tool_choice needs tools", param="tool_choice")
    if not tools:
        return ToolPlan(spec=answer)
    funcs = {t.function.name: t.function for t in tools}
    params = {n: f.parameters or ANY_OBJECT for n, f in funcs.items()}
    template_tools = [t.model_dump(exclude_none=True) for t in tools]
    mode = "auto" if choice is None else ("named" if isinstance(choice, NamedToolChoice) else choice)
    parallel = body.parallel_tool_calls
    if mode == "named":
        assert isinstance(choice, NamedToolChoice)
        name = choice.function["name"]
        if name not in funcs:
            raise BadRequest(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        spec = ("json_schema", schema_text(params[name], "tools"))
        return ToolPlan("named", name, spec, template_tools, NamedArgumentsParser(name), False)
    if mode == "none":
        return ToolPlan("none", None, answer, template_tools)
    try:
        reader = get_parser(parser, frozenset(funcs))
    except ValueError as exc:
        raise BadRequest(str(exc), param="tools") from None
    if mode == "auto" and answer is not None and answer[0] in ("regex", "grammar"):
        # vLLM's guided_regex / guided_grammar describe the whole output text, calls included
        return ToolPlan("auto", None, answer, template_tools, reader, parallel)
    tagged = tool_grammar(mode, params, parser, parallel, answer)
    if mode == "required":
        if tagged is not None:
            return ToolPlan("required", None, tagged, template_tools, reader, parallel)
        return ToolPlan("required", None, _call_array(params, parallel), template_tools, JsonCallsParser(), parallel)
    # auto: a format without a tagged form constrains only the answer (the calls are not constrained)
    return ToolPlan("auto", None, tagged or answer, template_tools, reader, parallel)


def _call_array(params: dict[str, Any], parallel: bool) -> Spec:
    """``required`` for formats without a tagged form: a JSON array of calls (one object when
    parallel calls are off), ``name`` first."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": n}, "arguments": p},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for n, p in params.items()
    ]
    one = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {"type": "array", "items": one, "minItems": 1} if parallel else one
    return ("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False))


def template_messages(body: ChatRequest, template: str) -> list[dict[str, Any]]:
    """Messages as the chat template expects them; refuses content parts that are not text."""
    knows_tool_calls = "tool_calls" in (template or "")
    knows_developer = "developer" in (template or "")  # else it is a system message (OpenAI's meaning)
    out = []
    for i, m in enumerate(body.messages):
        if isinstance(m.content, list):
            texts: list[str] = []
            for j, part in enumerate(m.content):
                if part.type == "text" and not isinstance(part.text, str):
                    raise BadRequest(  # a text part without its text is not an unsupported type
                        f"Missing required parameter: 'messages[{i}].content[{j}].text'.",
                        param=f"messages[{i}].content[{j}].text",
                        code="missing_required_parameter",
                    )
                if part.type != "text":
                    raise BadRequest(
                        f"content parts of type {part.type!r} are not supported (text only)",
                        param=f"messages[{i}].content[{j}].type",
                        code="unsupported_parameter",
                    )
                texts.append(part.text or "")  # a str here (checked above)
            content = "".join(texts)
        else:
            content = m.content or ""
        role = "system" if m.role == "developer" and not knows_developer else m.role
        msg: dict[str, Any] = {"role": role, "content": content}
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


def _same_arguments(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return a == b


def _usable(plan: ToolPlan, calls: list[PartialCall]) -> list[PartialCall]:
    """The calls a client gets: a repeat of an earlier call (same name, same arguments) is dropped
    (a model that writes one call twice means it once, and an agent would run it twice); a call
    that may still turn out to be one waits until it is complete before it streams."""
    out: list[PartialCall] = []
    for call in calls:
        if call.name is not None and any(p.name == call.name for p in out):
            if not call.done:
                call = replace(call, streamable=False)
            elif any(p.name == call.name and p.done and _same_arguments(p.args, call.args) for p in out):
                continue
        out.append(call)
    return out if plan.parallel else out[:1]


def parse_output(plan: ToolPlan, text: str) -> tuple[str | None, list[ToolCallOut]]:
    """(content, tool calls) of a finished choice."""
    if plan.parser is None:
        return text, []
    scan = plan.parser.scan(text, final=True)
    calls = [ToolCallOut(c.name or "", c.args) for c in _usable(plan, scan.calls) if plan.mode == "named" or c.valid()]
    if not calls:
        return text, []
    return (scan.content.strip() or None), calls


def finish_reason(plan: ToolPlan, reason: str | None, calls: list[Any]) -> str | None:
    """OpenAI: ``tool_calls`` when the model chose to call (auto / required); a named tool_choice
    answers ``stop``; a cut-off answer stays ``length``."""
    if calls and reason == "stop" and plan.mode in ("auto", "required"):
        return "tool_calls"
    return reason


@dataclass
class _SentCall:
    id: str
    args_sent: int = 0


class ToolStream:
    """One choice's streaming deltas: text streams as it comes while it cannot be a call (the
    parser holds back only what might open one); calls stream their name once it is complete and
    then their arguments as they are written."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self._text: list[str] = []
        self._content_sent = 0
        self._calls: list[_SentCall] = []
        self._memo: dict[int, tuple[int, int]] = {}  # the JSON scan's progress (the text only grows)

    def delta(self, text: str, reason: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """(delta or None, finish_reason) for new ``text`` (``reason`` set on the last one)."""
        if self.plan.parser is None:
            return ({"content": text} if text else None), reason
        self._text.append(text)
        final = reason is not None
        if not text and not final:
            return None, None
        scan = self.plan.parser.scan("".join(self._text), final, self._memo)
        if final and len(_usable(self.plan, scan.calls)) < len(self._calls):
            # Cut off (max_tokens) inside a call already streamed: the final scan turns that call's
            # text back into content, but the client has it as a call: nothing can be taken back,
            # so it stays a call (arguments incomplete) and is not sent a second time as content.
            scan = self.plan.parser.scan("".join(self._text), False, self._memo)
        d: dict[str, Any] = {}
        if len(scan.content) > self._content_sent:
            d["content"] = scan.content[self._content_sent :]
            self._content_sent = len(scan.content)
        out: list[dict[str, Any]] = []
        for k, call in enumerate(_usable(self.plan, scan.calls)):
            if k == len(self._calls):
                if call.name is None or not (call.streamable or call.done):
                    break  # not known yet: later calls wait for this one
                self._calls.append(_SentCall("call_" + uuid.uuid4().hex[:24]))
                sent = self._calls[k]
                first: dict[str, Any] = {"name": call.name, "arguments": ""}
                out.append({"index": k, "id": sent.id, "type": "function", "function": first})
            sent = self._calls[k]
            if len(call.args) > sent.args_sent:
                piece = call.args[sent.args_sent :]
                sent.args_sent = len(call.args)
                if out and out[-1]["index"] == k:
                    out[-1]["function"]["arguments"] = piece
                else:
                    out.append({"index": k, "function": {"arguments": piece}})
        if out:
            d["tool_calls"] = out
        return (d or None), finish_reason(self.plan, reason, self._calls)
