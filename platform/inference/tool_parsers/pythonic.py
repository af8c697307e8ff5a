"""Pythonic format (Llama 3.2 / 4 style): the output is a Python list of calls,
``[get_weather(city="Paris"), get_time()]``; arguments are literals. The first non-blank character
decides text or calls; calls are reported once the list is complete (a partial Python expression
cannot be turned into JSON arguments safely). A list that names a tool that was not offered is
text as a whole."""

from __future__ import annotations

import ast
import json

from loraplex.platform.inference.tool_parsers.base import PartialCall, Scan
from loraplex.platform.inference.tool_parsers.json_scan import Memo, Offered, skip_ws


def _calls(text: str, offered: Offered) -> list[PartialCall] | None:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List):
        return None
    out = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        if offered is not None and node.func.id not in offered:
            return None
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
            text_args = json.dumps(args, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        out.append(PartialCall(node.func.id, text_args, True))
    return out


class PythonicParser:
    name = "pythonic"

    def __init__(self, offered: Offered = None) -> None:
        self.offered = offered

    def scan(self, text: str, final: bool, memo: Memo | None = None) -> Scan:
        i = skip_ws(text, 0)
        if i >= len(text):
            return Scan(text if final else "")
        if text[i] != "[":
            return Scan(text)
        if not final and not text.rstrip().endswith("]"):
            return Scan("")  # a list can only be complete once it ends with "]": parse only then
        calls = _calls(text, self.offered)
        if calls is None:
            return Scan(text) if final else Scan("")
        return Scan("", calls)
