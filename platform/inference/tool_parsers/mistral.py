"""Mistral format: text, then ``[TOOL_CALLS]`` and a JSON array of ``{"name", "arguments"}``
objects. ``[TOOL_CALLS]`` is a special token in Mistral's tokenizers: the engine's text keeps it
only if the tokenizer does not mark it special (skip_special_tokens drops special tokens)."""

from __future__ import annotations

from loraplex.platform.inference.tool_parsers.base import ARG_KEYS, PartialCall, Scan, held_back
from loraplex.platform.inference.tool_parsers.json_scan import Memo, read_call_list, read_call_object, skip_ws

MARKER = "[TOOL_CALLS]"


class MistralParser:
    name = "mistral"

    def scan(self, text: str, final: bool, memo: Memo | None = None) -> Scan:
        start = text.find(MARKER)
        if start < 0:
            return Scan(text if final else text[: len(text) - held_back(text, MARKER)])
        before = text[:start]
        j = skip_ws(text, start + len(MARKER))
        if j >= len(text):
            return Scan(text if final else before)
        if text[j] == "{":  # some versions write objects without the array
            obj = read_call_object(text, j, ARG_KEYS, memo)
            objs = None if obj is None else [obj]
        else:
            read = read_call_list(text, j, ARG_KEYS, memo) if text[j] == "[" else None
            objs = None if read is None else read[0]
        if objs is None:
            return Scan(text if final else before)
        calls = [PartialCall.of(o) for o in objs]
        if final and (not calls or not all(c.valid() for c in calls)):
            return Scan(text)
        return Scan(before, calls)
