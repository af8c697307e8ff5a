"""Small bounds a hostile round found open (issue 32, hostile round 2), on SQLite and PostgreSQL:
end-user identifiers (``user``, ``safety_identifier``, ``prompt_cache_key``) were accepted at any
length and written whole to the request log; the Responses ``include`` list was unbounded; a text
content part without its ``text`` was refused as an "unsupported type"; the audit log ignored
``offset`` (a client paging with it got the first page forever)."""

from __future__ import annotations

import httpx
import pytest
from platform_helpers import admin_headers

from loraplex.platform.inference.openai_schemas import (
    MAX_PROMPT_CACHE_KEY_CHARS,
    MAX_SAFETY_IDENTIFIER_CHARS,
    MAX_USER_CHARS,
)

pytestmark = pytest.mark.timeout(600)

MSGS = [{"role": "user", "content": "hi"}]
BODIES = {
    "chat": ("/v1/chat/completions", {"model": "bot", "messages": MSGS, "max_tokens": 2}),
    "completions": ("/v1/completions", {"model": "bot", "prompt": "hi", "max_tokens": 2}),
    "responses": ("/v1/responses", {"model": "bot", "input": "hi", "max_output_tokens": 2}),
}
FIELDS = {
    "user": MAX_USER_CHARS,
    "safety_identifier": MAX_SAFETY_IDENTIFIER_CHARS,
    "prompt_cache_key": MAX_PROMPT_CACHE_KEY_CHARS,
}


@pytest.fixture
def api(module_tenant_setup):
    _, url, _, key, _, _ = module_tenant_setup
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
        yield c


def _error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


@pytest.mark.parametrize("endpoint", list(BODIES))
@pytest.mark.parametrize("field", list(FIELDS))
def test_identifiers_are_bounded(api, endpoint, field):
    path, body = BODIES[endpoint]
    at = api.post(path, json={**body, field: "u" * FIELDS[field]})
    assert at.status_code == 200, at.text
    for size in (FIELDS[field] + 1, 1_000_000):
        err = _error(api.post(path, json={**body, field: "u" * size}))
        assert err["param"] == field and err["code"] == "string_above_max_length", err


def test_responses_include_is_bounded_to_known_values(api):
    path, body = BODIES["responses"]
    ok = api.post(path, json={**body, "include": ["message.output_text.logprobs", "reasoning.encrypted_content"]})
    assert ok.status_code == 200, ok.text
    err = _error(api.post(path, json={**body, "include": ["x"] * 100_000}))
    assert err["param"] == "include", err
    err = _error(api.post(path, json={**body, "include": ["no.such.value"]}))
    assert err["param"] == "include[0]" and err["code"] == "invalid_value", err
    err = _error(api.post(path, json={**body, "include": ["reasoning.encrypted_content"] * 9}))
    assert err["param"] == "include", err
    rid = ok.json()["id"]
    assert api.get(f"/v1/responses/{rid}/input_items", params={"include": "message.input_image.image_url"}).is_success
    err = _error(api.get(f"/v1/responses/{rid}/input_items", params={"include": "no.such.value"}))
    assert err["param"].startswith("include"), err


@pytest.mark.parametrize(
    "endpoint,body,param",
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text"}]}], "max_tokens": 2},
            "messages[0].content[0].text",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": None}]}
                ],
                "max_tokens": 2,
            },
            "messages[0].content[1].text",
        ),
        (
            "/v1/responses",
            {"input": [{"role": "user", "content": [{"type": "input_text"}]}], "max_output_tokens": 2},
            "input[0].content[0].text",
        ),
    ],
    ids=["chat", "chat-null", "responses"],
)
def test_a_text_part_without_text_names_the_missing_field(api, endpoint, body, param):
    err = _error(api.post(endpoint, json={"model": "bot", **body}))
    assert err["param"] == param and err["code"] == "missing_required_parameter", err
    assert param in err["message"] and "not supported" not in err["message"], err


def test_audit_log_pages_with_a_bounded_offset(module_tenant_setup):
    _, url, *_ = module_tenant_setup
    with httpx.Client(base_url=url, headers=admin_headers(), timeout=60) as admin:
        for i in range(3):  # something to page through
            assert admin.post("/admin/v1/tenants", json={"name": f"audit-{i}"}).status_code == 201
        first = admin.get("/admin/v1/audit", params={"limit": 2}).json()["data"]
        second = admin.get("/admin/v1/audit", params={"limit": 2, "offset": 2}).json()["data"]
        assert len(first) == 2 and second and not {e["id"] for e in first} & {e["id"] for e in second}
        whole = admin.get("/admin/v1/audit", params={"limit": 4}).json()["data"]
        assert [e["id"] for e in whole] == [e["id"] for e in first + second][:4]
        for bad in (2**40, -1):
            r = admin.get("/admin/v1/audit", params={"offset": bad})
            assert r.status_code == 422 and r.json()["error"]["param"] == "offset", r.text  # the admin API's 422
        r = admin.get("/admin/v1/audit", params={"action": "x" * 1000})
        assert r.status_code == 422 and r.json()["error"]["param"] == "action", r.text
