"""NUL characters (U+0000) in what the Responses API stores, on SQLite and PostgreSQL (whose TEXT
refuses a NUL byte): input text, instructions, metadata keys and values, text.format fields and tool
definitions are stored and read back exactly (they are kept as JSON, where a NUL is the escape
``\\u0000``); an id holding one is a 404 on both backends, never a 500 or a database message
(issue 32, hostile round 2)."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.timeout(600)

NUL = "a\x00b\x00"
SCHEMA = {"type": "object", "properties": {NUL: {"type": "string", "description": NUL}}}

BODIES = {
    "input": {"input": NUL},
    "input_parts": {"input": [{"role": "user", "content": [{"type": "input_text", "text": NUL}]}]},
    "instructions": {"input": "hi", "instructions": NUL},
    "metadata": {"input": "hi", "metadata": {"k": NUL, NUL: "v"}},
    "text_format": {
        "input": "hi",
        "text": {"format": {"type": "json_schema", "name": "x", "description": NUL, "schema": SCHEMA}},
    },
    "tools": {
        "input": "hi",
        "tools": [{"type": "function", "name": "f", "description": NUL, "parameters": SCHEMA}],
    },
}


@pytest.fixture
def api(module_tenant_setup):
    _, url, _, key, _, _ = module_tenant_setup
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
        yield c


@pytest.mark.parametrize("field", list(BODIES))
def test_nul_in_stored_fields_reads_back_exactly(api, field):
    r = api.post("/v1/responses", json={"model": "bot", "max_output_tokens": 2, **BODIES[field]})
    assert r.status_code == 200, r.text
    created = r.json()
    got = api.get(f"/v1/responses/{created['id']}")
    assert got.status_code == 200, got.text
    assert got.json() == created  # every field, NULs included
    items = api.get(f"/v1/responses/{created['id']}/input_items")
    assert items.status_code == 200, items.text
    if field in ("input", "input_parts"):
        texts = [p["text"] for it in items.json()["data"] for p in it.get("content", [])]
        assert NUL in texts
    # a follow-up continues from the stored conversation, NULs and all
    follow = api.post(
        "/v1/responses",
        json={"model": "bot", "input": "more", "previous_response_id": created["id"], "max_output_tokens": 2},
    )
    assert follow.status_code == 200, follow.text


def test_nul_in_a_streamed_response_is_stored_exactly(api):
    with api.stream(
        "POST",
        "/v1/responses",
        json={"model": "bot", "input": NUL, "instructions": NUL, "stream": True, "max_output_tokens": 2},
    ) as r:
        assert r.status_code == 200
        text = r.read().decode()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]
    rid = next(e["response"]["id"] for e in events if e.get("type") in ("response.completed", "response.incomplete"))
    got = api.get(f"/v1/responses/{rid}")
    assert got.status_code == 200 and got.json()["instructions"] == NUL


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("GET", "/v1/responses/resp_a%00b", None),
        ("GET", "/v1/responses/resp_a%00b/input_items", None),
        ("DELETE", "/v1/responses/resp_a%00b", None),
        ("POST", "/v1/responses", {"model": "bot", "input": "hi", "previous_response_id": "resp_\x00"}),
    ],
    ids=["get", "input_items", "delete", "previous_response_id"],
)
def test_an_id_holding_nul_is_a_404_on_both_backends(api, method, path, body):
    r = api.request(method, path, json=body)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "response_not_found"
