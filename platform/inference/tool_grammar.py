"""The output grammar of a request with tools, in the served model's OWN call format.

A model writes tool calls the way its chat template taught it (Hermes: ``<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>``; Llama 3: ``{"name": ..., "parameters": {...}}``), and after a
call it has learned to stop. A grammar in another shape (a JSON array of calls) takes it out of
what it knows: it cannot tell where the list ends and writes the same call again until
``max_tokens``. So the constraint is an xgrammar structural tag (engine kind ``structural_tag``)
built per tool-call format, whose tags are exactly the text the format's parser reads back:

- ``required``: one or more calls and nothing else; the list may END after every complete call
  (the model's own end of turn), so a one-tool question gets one call; further calls stay possible
  when the model writes them. ``parallel_tool_calls: false``: exactly one call.
- ``auto``: free text, and once a call has started it is a call to an offered tool whose arguments
  match its schema (Hermes: calls may follow text; Llama 3: the whole output is calls or text,
  as its parser reads it). After a call the model may end, write text or (parallel) call again.
- ``auto`` beside a JSON answer constraint (``response_format``, ``guided_json``): a tool call OR
  the schema'd answer, as OpenAI does; neither free text nor both. (A raw-text constraint,
  ``guided_regex`` / ``guided_grammar``, shapes the whole output, calls included, as in vLLM:
  plan_tools uses it alone.)

Formats without such a form (mistral, pythonic) return None: the caller keeps its JSON-array
grammar for ``required`` and leaves ``auto`` unconstrained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loraplex.platform.inference.structured import Spec

# The longest whitespace run inside JSON (arguments, answers): ``{"city": "Paris"}`` as models
# write it, never unbounded (a model free to emit whitespace can pad until max_tokens).
MAX_WHITESPACE = 1


@dataclass(frozen=True)
class CallSyntax:
    """How one format writes a call: ``begin`` (with the tool's name), the arguments, one of ``ends``."""

    begin: str  # ``{name}``: the JSON string of the tool's name
    ends: tuple[str, ...]
    trigger: str  # what every call starts with (the parser's marker)
    between: str  # regex for what may separate parallel calls
    prefix: str | None = None  # an optional marker before the calls (Llama 3's <|python_tag|>)
    text_before_calls: bool = True  # False: an output that starts as text is text to its end


SYNTAX: dict[str, CallSyntax] = {
    "hermes": CallSyntax(
        begin='<tool_call>\n{{"name": {name}, "arguments": ',
        ends=("}\n</tool_call>", "}</tool_call>"),
        trigger="<tool_call>",
        between=r"\s{0,2}",
    ),
    "llama3_json": CallSyntax(
        begin='{{"name": {name}, "parameters": ',
        ends=("}",),
        trigger='{"name":',
        between=r"\s?;\s?",
        prefix="<|python_tag|>",
        text_before_calls=False,
    ),
}


def _json(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_WHITESPACE}


def _tags(syntax: CallSyntax, functions: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "tag",
            "begin": syntax.begin.format(name=json.dumps(name, ensure_ascii=False)),
            "content": _json(params),
            "end": list(syntax.ends),
        }
        for name, params in functions.items()
    ]


def _calls(syntax: CallSyntax, tags: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """One call, or one or more separated by ``between``: complete after every call."""
    one: dict[str, Any] = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
    calls = one
    if parallel:
        more = {"type": "sequence", "elements": [{"type": "regex", "pattern": syntax.between}, one]}
        calls = {"type": "sequence", "elements": [one, {"type": "star", "content": more}]}
    if syntax.prefix is None:
        return calls
    marker = {"type": "optional", "content": {"type": "const_string", "value": syntax.prefix}}
    return {"type": "sequence", "elements": [marker, calls]}


def _answer(spec: Spec) -> dict[str, Any]:
    kind, value = spec
    if kind == "json_object":
        return _json({"type": "object"})
    if kind == "json_schema":
        return _json(json.loads(value))
    raise ValueError(f"a {kind} answer is the whole output, not one beside tool calls")


def tool_grammar(
    mode: str,
    functions: dict[str, dict[str, Any]],
    parser: str,
    parallel: bool,
    answer: Spec | None = None,
) -> Spec | None:
    """The ``structural_tag`` spec for ``mode`` (auto | required) over ``functions`` (name ->
    parameters schema) in ``parser``'s format, with ``answer`` the JSON answer constraint of an auto
    request (json_schema / json_object; None: free text); None where the format has no tagged form."""
    syntax = SYNTAX.get(parser)
    if syntax is None or not functions:
        return None
    tags = _tags(syntax, functions)
    if mode == "required":
        fmt = _calls(syntax, tags, parallel)
    elif answer is not None:
        fmt = {"type": "or", "elements": [_calls(syntax, tags, parallel), _answer(answer)]}
    elif syntax.text_before_calls:
        fmt = {"type": "triggered_tags", "triggers": [syntax.trigger], "tags": tags, "stop_after_first": not parallel}
    else:  # calls from the start, or text that never opens one
        text = {"type": "any_text", "excludes": [syntax.trigger]}
        fmt = {"type": "or", "elements": [_calls(syntax, tags, parallel), text]}
    return ("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False))
