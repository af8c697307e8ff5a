"""The outputs whose shape we impose with a grammar: ``required`` (a JSON array of one or more
``{"name", "arguments"}`` objects, or one object when parallel calls are off) and a named
tool_choice (the output IS the arguments of the named function)."""

from __future__ import annotations

from loraplex.platform.inference.tool_parsers.base import PartialCall, Scan
from loraplex.platform.inference.tool_parsers.json_scan import (
    Memo,
    read_call_list,
    read_call_object,
    skip_ws,
    value_end,
)

ARGS = ("arguments",)


class JsonCallsParser:
    name = "json_calls"

    def scan(self, text: str, final: bool, memo: Memo | None = None) -> Scan:
        i = skip_ws(text, 0)
        if i >= len(text):
            return Scan(text if final else "")
        if text[i] == "{":
            obj = read_call_object(text, i, ARGS, memo)
            objs = None if obj is None else [obj]
        elif text[i] == "[":
            listed, _end, bad = read_call_list(text, i, ARGS, memo)
            objs = None if bad is not None else listed
        else:
            objs = None
        if objs is None:
            return Scan(text)
        calls = [PartialCall.of(o) for o in objs]
        if final:  # cut off by max_tokens: the complete calls stand; none at all: the text
            calls = [c for c in calls if c.valid()]
            if not calls:
                return Scan(text)
        return Scan("", calls)


class NamedArgumentsParser:
    name = "named"

    def __init__(self, function: str) -> None:
        self.function = function

    def scan(self, text: str, final: bool, memo: Memo | None = None) -> Scan:
        i = skip_ws(text, 0)
        done = i < len(text) and value_end(text, i, memo) is not None
        return Scan("", [PartialCall(self.function, text, done or final)])
