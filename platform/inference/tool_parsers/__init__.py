"""Tool-call parsers, chosen per served model (``[openai] tool_call_parser``, vLLM's
``--tool-call-parser``): each reads calls back from the text a model writes in its template's format.
``JsonCallsParser`` reads the output of a ``required`` tool_choice, whose grammar we impose."""

from __future__ import annotations

from loraplex.platform.inference.tool_parsers.base import PartialCall, Scan, ToolParser
from loraplex.platform.inference.tool_parsers.hermes import HermesParser
from loraplex.platform.inference.tool_parsers.json_calls import JsonCallsParser, NamedArgumentsParser
from loraplex.platform.inference.tool_parsers.llama3_json import Llama3JsonParser
from loraplex.platform.inference.tool_parsers.mistral import MistralParser
from loraplex.platform.inference.tool_parsers.pythonic import PythonicParser

PARSERS: dict[str, type] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
}


def get_parser(name: str, offered: frozenset[str] | None = None) -> ToolParser:
    """The parser ``name``; with ``offered``, a "call" to any other tool is text (OpenAI never
    returns a call to a tool the request did not offer)."""
    try:
        return PARSERS[name](offered)
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; one of {sorted(PARSERS)}") from None


__all__ = [
    "PARSERS",
    "JsonCallsParser",
    "NamedArgumentsParser",
    "PartialCall",
    "Scan",
    "ToolParser",
    "get_parser",
]
