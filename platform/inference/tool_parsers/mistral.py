"""Mistral format: text, then ``[TOOL_CALLS]`` and a JSON array of ``{"name", "arguments"}``
objects. ``[TOOL_CALLS]`` is a special token in Mistral's tokenizers: the engine's text keeps it
only if the tokenizer does not mark it special (skip_special_tokens drops special tokens). An element
that is not a call (malformed, cut off, or naming a tool that was not offered) is text from there on;
the calls before it stand."""

from __future__ import annotations

from loraplex.platform.inference.tool_parsers.base import ARG_KEYS, PartialCall, Scan, held_back
from loraplex.platform.inference.tool_parsers.json_scan import (
    Memo,
    ObjectCall,
    Offered,
    read_call_list,
    read_call_object,
    skip_ws,
)

MARKER = "[TOOL_CALLS]"


class MistralParser:
    name = "mistral"

    def __init__(self, offered: Offered = None) -> None:
        self.offered = offered

    def scan(self, text: str, final: bool, memo: Memo | None = None) -> Scan:
        start = text.find(MARKER)
        if start < 0:
            return Scan(text if final else text[: len(text) - held_back(text, MARKER)])
        before = text[:start]
        j = skip_ws(text, start + len(MARKER))
        if j >= len(text):
            return Scan(text if final else before)
        objs: list[ObjectCall] = []
        bad: int | None = j  # where the text that is not a call starts
        if text[j] == "{":  # some versions write objects without the array
            obj = read_call_object(text, j, ARG_KEYS, memo, self.offered)
            objs, bad = ([], j) if obj is None else ([obj], None)
        elif text[j] == "[":
            objs, _end, bad = read_call_list(text, j, ARG_KEYS, memo, self.offered)
        calls = [PartialCall.of(o) for o in objs]
        if final:
            for k, call in enumerate(calls):
                if not call.valid():
                    calls, bad = calls[:k], objs[k].start
                    break
        if bad is None:
            return Scan(before, calls)
        return Scan(before + text[bad:], calls) if calls else Scan(text)
