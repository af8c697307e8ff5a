"""Hermes / Qwen format: text with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks (any number, anywhere). A block that is not a call (malformed, or naming a tool that was
not offered) is text, and so is everything after it."""

from __future__ import annotations

from loraplex.platform.inference.tool_parsers.base import ARG_KEYS, PartialCall, Scan, held_back
from loraplex.platform.inference.tool_parsers.json_scan import Memo, Offered, read_call_object, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser:
    name = "hermes"

    def __init__(self, offered: Offered = None) -> None:
        self.offered = offered

    def scan(self, text: str, final: bool, memo: Memo | None = None) -> Scan:
        content: list[str] = []
        calls: list[PartialCall] = []
        i = 0
        while True:
            start = text.find(OPEN, i)
            if start < 0:
                rest = text[i:]
                content.append(rest if final else rest[: len(rest) - held_back(rest, OPEN)])
                return Scan("".join(content), calls)
            content.append(text[i:start])
            j = skip_ws(text, start + len(OPEN))
            if j >= len(text):  # only the tag so far
                if final:
                    content.append(text[start:])
                return Scan("".join(content), calls)
            obj = read_call_object(text, j, ARG_KEYS, memo, self.offered) if text[j] == "{" else None
            call = PartialCall.of(obj) if obj is not None else None
            if call is None or (final and not call.valid()):
                content.append(text[start:])  # not a call after all: it is text
                return Scan("".join(content), calls)
            calls.append(call)
            if obj is None or obj.end is None:
                return Scan("".join(content), calls)
            k = skip_ws(text, obj.end)
            if text.startswith(CLOSE, k):
                i = k + len(CLOSE)
            elif final or (k < len(text) and not CLOSE.startswith(text[k : k + len(CLOSE)])):
                i = k  # no closing tag: the call stands, what follows is text
            else:
                return Scan("".join(content), calls)
