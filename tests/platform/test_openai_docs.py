"""docs/openai-api.md names every request field of /v1/chat/completions, /v1/completions and
/v1/responses — each declared field, each refused one (``UNSUPPORTED``) and each accepted-and-ignored
one (``HARMLESS``) — so a field added to a schema without a line in the docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

from loraplex.platform.inference import openai_schemas
from loraplex.platform.inference.openai_schemas import ChatRequest, CompletionRequest
from loraplex.platform.inference.responses_api import schemas as responses_schemas
from loraplex.platform.inference.responses_api.schemas import ResponsesRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai-api.md"


def _named(section: str) -> set[str]:
    """Every word written as code in a section of the docs (`a`, `a.b`, `a` / `b`)."""
    return {w for code in re.findall(r"`([^`]+)`", section) for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", code)}


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _fields(model) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def test_every_chat_and_completions_field_is_documented():
    named = _named(DOC.read_text())
    expected = (
        _fields(ChatRequest) | _fields(CompletionRequest) | set(openai_schemas.UNSUPPORTED) | openai_schemas.HARMLESS
    )
    assert not expected - named, sorted(expected - named)


def test_every_responses_field_is_documented_in_its_section():
    named = _named(_section("## Responses API"))
    expected = _fields(ResponsesRequest) | set(responses_schemas.UNSUPPORTED)
    assert not expected - named, sorted(expected - named)


def test_every_refused_field_is_listed_as_refused():
    refused = _named(_section("## Refused"))
    assert not set(openai_schemas.UNSUPPORTED) - refused, sorted(set(openai_schemas.UNSUPPORTED) - refused)
