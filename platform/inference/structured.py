"""OpenAI ``response_format`` (and vLLM's ``guided_*``) -> the engine's structured-output spec.

The spec travels to the gateway as a plain ``(kind, value)`` pair (the platform never imports the
engine); the gateway compiles it in the request's worker thread before the request is queued.
"""

from __future__ import annotations

import json
from typing import Any

from loraplex.platform.errors import BadRequest
from loraplex.platform.inference.openai_schemas import _Common

Spec = tuple[str, str]


def schema_text(schema: dict[str, Any] | str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise BadRequest("the JSON schema is not valid JSON", param="response_format") from None
    if not isinstance(schema, dict):
        raise BadRequest("a JSON schema must be an object", param="response_format")
    return json.dumps(schema, sort_keys=True)  # one cache key per schema, whatever its key order


def response_spec(body: _Common) -> Spec | None:
    given = [name for name in ("guided_json", "guided_regex", "guided_grammar") if getattr(body, name) is not None]
    rf = body.response_format
    if rf is not None and rf.type != "text":
        given.insert(0, "response_format")
    if len(given) > 1:
        raise BadRequest(f"only one of {', '.join(given)} may be given", param=given[1])
    if not given:
        return None
    if given[0] == "response_format":
        assert rf is not None
        if rf.type == "json_object":
            return ("json_object", "")
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise BadRequest("response_format json_schema needs json_schema.schema", param="response_format")
        return ("json_schema", schema_text(rf.json_schema.schema_))
    if given[0] == "guided_json":
        return ("json_schema", schema_text(body.guided_json))  # type: ignore[arg-type]
    if given[0] == "guided_regex":
        return ("regex", body.guided_regex or "")
    return ("grammar", body.guided_grammar or "")
