"""Hostile round 4 (issue 32): one tenant's body must not freeze the server for every other tenant.

FastAPI validates a request body on the event loop, item by item. Found by the hostile re-run: a
4 MiB chat body of 120,000 one-character messages, 130,000 content parts or 70,000 tool calls, a
Responses ``input`` of 110,000 items, or a completions ``prompt`` of 800,000 one-token lists was
walked whole before any bound applied (the character bound, ``MAX_PROMPTS``) and held the event
loop, so /health and every other tenant's streams stopped, for 2.4-10 s per request on a loaded
2-core machine (a 400 at the end: the attacker paid nothing). The bounds now apply to the raw lists
before pydantic walks them: a request over them is a 400 naming the parameter and the count it
sent, whatever it would have cost to validate. Real server, official client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from loraplex.platform.inference.openai_schemas import MAX_MESSAGE_ITEMS, MAX_PROMPTS

pytestmark = pytest.mark.timeout(600)


def _refused(call, param: str) -> dict:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    body = err.value.body
    assert isinstance(body, dict), body
    assert body.get("param") == param and body.get("type") == "invalid_request_error", body
    return body


def test_chat_messages_over_the_item_bound_are_refused_before_validation(module_tenant_setup):
    *_, client = module_tenant_setup
    n = MAX_MESSAGE_ITEMS + 1
    many = [{"role": "user", "content": "x"}] * n
    body = _refused(lambda: client.chat.completions.create(model="bot", messages=many, max_tokens=2), "messages")
    assert body["code"] == "array_above_max_length" and str(n) in body["message"], body


def test_content_parts_and_tool_calls_count_towards_the_bound(module_tenant_setup):
    *_, client = module_tenant_setup
    parts = [{"type": "text", "text": "x"}] * MAX_MESSAGE_ITEMS
    body = _refused(
        lambda: client.chat.completions.create(
            model="bot", messages=[{"role": "user", "content": parts}], max_tokens=2
        ),
        "messages",
    )
    assert body["code"] == "array_above_max_length", body  # one message + its parts: one over
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(5000)]
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": calls}]
    body = _refused(lambda: client.chat.completions.create(model="bot", messages=messages, max_tokens=2), "messages")
    assert body["code"] == "array_above_max_length" and "5002" in body["message"], body


def test_a_body_at_the_bound_is_not_refused_for_its_item_count(module_tenant_setup):
    *_, client = module_tenant_setup
    parts = [{"type": "text", "text": "x"}] * (MAX_MESSAGE_ITEMS - 1)  # one message + parts = the bound
    try:
        client.chat.completions.create(model="bot", messages=[{"role": "user", "content": parts}], max_tokens=2)
    except openai.BadRequestError as err:  # the prompt may not fit the demo model: another 400
        assert isinstance(err.body, dict) and err.body.get("code") != "array_above_max_length", err.body


def _refused_raw(url: str, key: str, path: str, body: dict, param: str) -> dict:
    """``_refused`` for a body sent as the bytes the official client sends (compact JSON), without
    the client: for a 200,000-item list the openai SDK's request transform alone took ~2.6 s of CPU
    per request (~16 of the 17 s this module's prompt-list test took quiet), all of it before the
    server under test saw a byte. The server's answer is checked exactly as ``_refused`` does."""
    content = json.dumps(body, separators=(",", ":"))
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    r = httpx.post(url + path, content=content, headers=headers, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert isinstance(err, dict), err
    assert err.get("param") == param and err.get("type") == "invalid_request_error", err
    return err


def test_prompt_lists_are_counted_before_validation(module_tenant_setup):
    _, url, _, key, _, client = module_tenant_setup
    n = 200_000

    def refused(prompt: list) -> dict:
        return _refused_raw(url, key, "/v1/completions", {"model": "bot", "prompt": prompt, "max_tokens": 2}, "prompt")

    body = refused([[1]] * n)
    assert str(n) in body["message"] and str(MAX_PROMPTS) in body["message"], body
    body = refused(["x"] * n)
    assert str(n) in body["message"], body
    # A token-id prompt with something else hidden at its end: one 400, not three walks of the list.
    body = refused([1] * n + ["x"])
    assert "token ids" in body["message"], body
    # A token-id prompt itself stays a single prompt (its length is the context's business).
    r = client.completions.create(model="bot", prompt=[1, 2, 3], max_tokens=2)
    assert len(r.choices) == 1


def test_responses_input_items_over_the_bound_are_refused(module_tenant_setup):
    _, url, _, key, _, _ = module_tenant_setup
    n = MAX_MESSAGE_ITEMS + 1
    body = {"model": "bot", "input": [{"role": "user", "content": "x"}] * n, "max_output_tokens": 2}
    r = httpx.post(url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input" and err["code"] == "array_above_max_length" and str(n) in err["message"], err
    parts = [{"type": "input_text", "text": "x"}] * MAX_MESSAGE_ITEMS
    body = {"model": "bot", "input": [{"role": "user", "content": parts}], "max_output_tokens": 2}
    r = httpx.post(url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
