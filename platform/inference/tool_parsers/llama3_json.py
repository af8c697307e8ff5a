"""Llama 3.x JSON format: the whole output is one or more ``{"name": ..., "parameters": {...}}``
objects separated by ``;`` (optionally after ``<|python_tag|>``); an output that starts otherwise
is text. The first non-blank character decides. An object that is not a call (malformed, cut off,
or naming a tool that was not offered) is text from there on; the calls before it stand."""

from __future__ import annotations

from loraplex.platform.inference.tool_parsers.base import ARG_KEYS, PartialCall, Scan, held_back
from loraplex.platform.inference.tool_parsers.json_scan import Memo, Offered, read_call_object, skip_ws

TAG = "<|python_tag|>"


class Llama3JsonParser:
    name = "llama3_json"

    def __init__(self, offered: Offered = None) -> None:
        self.offered = offered

    def scan(self, text: str, final: bool, memo: Memo | None = None) -> Scan:
        i = skip_ws(text, 0)
        if text.startswith(TAG, i):
            i = skip_ws(text, i + len(TAG))
        elif not final and held_back(text[i:], TAG) == len(text) - i and i < len(text):
            return Scan("")  # maybe the tag: wait
        if i >= len(text):
            return Scan(text if final else "")
        if text[i] != "{":
            return Scan(text)
        calls: list[PartialCall] = []
        while i < len(text):
            obj = read_call_object(text, i, ARG_KEYS, memo, self.offered)
            call = None if obj is None else PartialCall.of(obj)
            if obj is None or call is None or (final and not call.valid()):
                return Scan(text[i:], calls) if calls else Scan(text)
            calls.append(call)
            if obj.end is None:
                break
            i = skip_ws(text, obj.end)
            if i < len(text) and text[i] == ";":
                i = skip_ws(text, i + 1)
            elif i < len(text):
                return Scan(text[i:], calls)  # text after the calls
        return Scan("", calls)
