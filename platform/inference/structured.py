"""OpenAI ``response_format`` (and vLLM's ``guided_*`` / ``structured_outputs``) -> the engine's
structured-output spec.

The spec travels to the engine as a plain ``(kind, value)`` pair (the platform never imports the
engine); the engine compiles it in the request's worker thread before the request is queued.

A JSON schema keeps the key order it was given in: xgrammar generates properties in schema order,
so ``{"reasoning", "answer"}`` reasons before it answers, as OpenAI does.
"""

from __future__ import annotations

import json
from typing import Any

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import _Common

Spec = tuple[str, str]
_REGEX_META = set("\\.^$*+?()[]{}|/-")


def schema_text(schema: dict[str, Any] | str, param: str = "response_format") -> str:
    """Compact JSON text of ``schema`` in its own key order (the order is part of its meaning)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise BadRequest("the JSON schema is not valid JSON", param=param) from None
    if not isinstance(schema, dict):
        raise BadRequest("a JSON schema must be an object", param=param)
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of ``choices`` (vLLM's guided_choice)."""
    return "(" + "|".join("".join("\\" + c if c in _REGEX_META else c for c in s) for s in choices) + ")"


def _structured_outputs(body: _Common) -> tuple[str, Spec] | None:
    so = body.structured_outputs
    if so is None:
        return None
    given: list[str] = [
        name
        for name, value in (
            ("json", so.json_),
            ("regex", so.regex),
            ("choice", so.choice),
            ("grammar", so.grammar),
            ("json_object", so.json_object or None),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise BadRequest(
            "structured_outputs needs exactly one of json, regex, choice, grammar, json_object",
            param="structured_outputs",
        )
    if so.whitespace_pattern is not None:
        raise BadRequest(
            "structured_outputs.whitespace_pattern is not supported (JSON is generated compact)",
            param="structured_outputs.whitespace_pattern",
            code="unsupported_parameter",
        )
    name = given[0]
    param = f"structured_outputs.{name}"
    if so.json_ is not None:
        return param, ("json_schema", schema_text(so.json_, param))
    if so.regex is not None:
        return param, ("regex", so.regex)
    if so.choice is not None:
        return param, ("regex", choice_regex(so.choice))
    if so.grammar is not None:
        return param, ("grammar", so.grammar)
    return param, ("json_object", "")


def response_spec(body: _Common) -> Spec | None:
    specs: list[tuple[str, Spec]] = []
    rf = body.response_format
    if rf is not None and rf.type != "text":
        if rf.type == "json_object":
            specs.append(("response_format", ("json_object", "")))
        elif rf.json_schema is None or rf.json_schema.schema_ is None:
            raise BadRequest("response_format json_schema needs json_schema.schema", param="response_format")
        else:
            specs.append(("response_format", ("json_schema", schema_text(rf.json_schema.schema_))))
    if body.guided_json is not None:
        specs.append(("guided_json", ("json_schema", schema_text(body.guided_json, "guided_json"))))
    if body.guided_regex is not None:
        specs.append(("guided_regex", ("regex", body.guided_regex)))
    if body.guided_grammar is not None:
        specs.append(("guided_grammar", ("grammar", body.guided_grammar)))
    if body.guided_choice is not None:
        specs.append(("guided_choice", ("regex", choice_regex(body.guided_choice))))
    so = _structured_outputs(body)
    if so is not None:
        specs.append(so)
    if len(specs) > 1:
        raise BadRequest(f"only one of {', '.join(n for n, _ in specs)} may be given", param=specs[1][0])
    return specs[0][1] if specs else None
