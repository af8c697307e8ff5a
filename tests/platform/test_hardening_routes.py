"""Limits on every route, checked before the expensive step (real uvicorn, the session's engine):

- tool definitions and assistant ``tool_calls`` count toward the character bound, and the bound is
  checked before the chat template runs: 20,000 assistant tool-call messages (or a tool whose
  description is longer than the context can hold) are a 400 with the template never rendered;
- ``/tokenize`` with a 15 MB body is a 413 (the default body limit), not 37 s and a gigabyte;
- a json_schema over the grammar size limit (a huge enum) is a 400 naming ``response_format``,
  in ``response_format`` and in a required tool's parameters alike."""

from __future__ import annotations

import json

import httpx
import pytest
from billing_helpers import auth, new_tenant

from loraplex.platform.quotas.store import InProcessQuotaStore


@pytest.fixture
def live(live_factory):
    return live_factory()


class _TemplateCounter:
    """Counts the chat template renders of the session tokenizer (delegating to the real one)."""

    def __init__(self, monkeypatch, tok) -> None:
        self.calls = 0
        real = tok.apply_chat_template

        def counting(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(tok, "apply_chat_template", counting)


def _chat(url: str, key: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, headers=auth(key), timeout=300)


def test_tool_calls_and_tool_definitions_are_bounded_before_templating(live, monkeypatch):
    tid, key = new_tenant(live.url, "tools")
    model = live.ctx.engine.model_name
    bound = live.ctx.engine.max_prompt_chars()
    assert bound is not None and bound < 3 * 1024 * 1024  # else the body limit would answer first
    renders = _TemplateCounter(monkeypatch, live.ctx.engine.tokenizer)
    hi = {"role": "user", "content": "hi"}

    # sanity: a normal chat with a tool renders the template once
    tool = {"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {}}}}
    assert _chat(live.url, key, {"model": model, "messages": [hi], "tools": [tool], "max_tokens": 2}).status_code == 200
    assert renders.calls == 1

    # 20,000 assistant messages, each one tool call: together over the bound
    per = max(20, bound // 20_000 + 1)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '"' + "y" * per + '"'}}
    many = [hi] + [{"role": "assistant", "tool_calls": [call]}] * 20_000
    r = _chat(live.url, key, {"model": model, "messages": many, "max_tokens": 2})
    # 20,001 items are over the raw-body item cap (4,096), checked even before the characters
    assert r.status_code == 400 and r.json()["error"]["code"] == "array_above_max_length", r.text[:300]

    # tool definitions alone: a description longer than the context can hold
    big = {"type": "function", "function": {"name": "get", "description": "d" * (bound + 1)}}
    r = _chat(live.url, key, {"model": model, "messages": [hi], "tools": [big], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    # ... and a parameters schema that is huge (its JSON counts, as the template renders it)
    params = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(bound // 20 + 1)}}
    assert len(json.dumps(params)) > bound
    wide = {"type": "function", "function": {"name": "get", "parameters": params}}
    r = _chat(live.url, key, {"model": model, "messages": [hi], "tools": [wide], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]

    assert renders.calls == 1  # none of the refused requests reached the template
    assert live.ctx.quotas.running(tid) == 0


def test_tokenize_refuses_a_15mb_body_with_413(live):
    _tid, key = new_tenant(live.url, "tok15")
    model = live.ctx.engine.model_name
    big = json.dumps({"model": model, "prompt": "a" * (15 * 1024 * 1024)})
    for path in ("/tokenize", "/detokenize"):
        r = httpx.post(
            live.url + path, content=big, headers={**auth(key), "content-type": "application/json"}, timeout=120
        )
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large", (path, r.text[:200])
    assert (
        httpx.post(
            live.url + "/tokenize", json={"model": model, "prompt": "hi"}, headers=auth(key), timeout=120
        ).status_code
        == 200
    )


def _enum_schema(k: int) -> dict:
    return {"type": "object", "properties": {"v": {"enum": [f"value-{j:06d}" for j in range(k)]}}, "required": ["v"]}


def test_a_schema_over_the_grammar_size_limit_is_a_400_naming_it(live):
    tid, key = new_tenant(live.url, "grammar")
    model = live.ctx.engine.model_name
    hi = [{"role": "user", "content": "hi"}]
    huge = _enum_schema(40_000)  # ~600 KB of JSON: over the 256 KiB grammar limit, under the body limit
    assert 256 * 1024 < len(json.dumps(huge)) < 3 * 1024 * 1024
    fmt = {"type": "json_schema", "json_schema": {"name": "v", "schema": huge}}
    r = _chat(live.url, key, {"model": model, "messages": hi, "response_format": fmt, "max_tokens": 4})
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["param"] == "response_format" and "limit" in err["message"], err
    # the same schema as a required tool's parameters: refused the same way, whatever carries it
    tool = {"type": "function", "function": {"name": "pick", "parameters": huge}}
    r = _chat(
        live.url, key, {"model": model, "messages": hi, "tools": [tool], "tool_choice": "required", "max_tokens": 4}
    )
    assert r.status_code == 400, r.text[:300]
    # nothing was reserved or left running by the refusals
    assert isinstance(live.ctx.quotas, InProcessQuotaStore)
    assert live.ctx.quotas.running(tid) == 0
    small = {"type": "json_schema", "json_schema": {"name": "v", "schema": _enum_schema(3)}}
    r = _chat(live.url, key, {"model": model, "messages": hi, "response_format": small, "max_tokens": 8})
    assert r.status_code == 200, r.text[:300]
