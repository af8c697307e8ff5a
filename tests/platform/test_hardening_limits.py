"""Limits on every route and no 500 for bad input: the body limit and the character bound reach
/tokenize, /detokenize and the admin API; tool-call arguments count toward the bound; integer
overflows in admin parameters are 400/422; a slow body is dropped with 408."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from billing_helpers import H, auth, new_tenant


@pytest.fixture
def live(live_factory):
    return live_factory(limits={"max_body_bytes": 64 * 1024, "max_admin_body_bytes": 8 * 1024, "body_timeout_s": 2})


def test_tokenize_and_detokenize_are_bounded(live):
    tid, key = new_tenant(live.url, "tok", quota={"rpm": 3})
    model = live.ctx.engine.model_name
    bound = live.ctx.engine.max_prompt_chars()
    with httpx.Client(base_url=live.url, headers=auth(key), timeout=60) as c:
        r = c.post("/tokenize", json={"model": model, "prompt": "x" * (200 * 1024)})
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        if bound is not None and bound < 60 * 1024:
            r = c.post("/tokenize", json={"model": model, "prompt": "x" * (bound + 1)})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = c.post("/detokenize", json={"model": model, "tokens": [1] * (live.ctx.engine.max_model_len + 1)})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
        assert c.post("/tokenize", json={"model": model, "prompt": "hi"}).status_code == 200
        # a tenant at its rpm limit is refused here too: tokenizing is no way around the limits (the
        # tokenizer calls above counted against the rpm of 3 like generation requests)
        codes = [
            c.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1}).status_code
            for _ in range(3)
        ]
        assert 429 in codes
        r = c.post("/tokenize", json={"model": model, "prompt": "hi"})
        assert r.status_code == 429 and r.headers["retry-after"]


def test_tool_call_arguments_count_toward_the_character_bound(live_factory):
    live = live_factory()  # the default body limit (4 MiB): the character bound answers first
    _tid, key = new_tenant(live.url, "tools")
    model = live.ctx.engine.model_name
    bound = live.ctx.engine.max_prompt_chars()
    assert bound is not None
    per = 40
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "y" * per}} for i in range(20)]
    many = max(1, bound // (per * 20) + 1)
    messages = [{"role": "user", "content": "hi"}] + [{"role": "assistant", "tool_calls": calls}] * many
    body = {"model": model, "messages": messages, "max_tokens": 2}
    r = httpx.post(live.url + "/v1/chat/completions", json=body, headers=auth(key), timeout=120)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]


def test_admin_api_has_a_body_limit_and_refuses_overflows(live):
    with httpx.Client(base_url=live.url, headers=H, timeout=60) as c:
        r = c.post("/admin/v1/tenants", json={"name": "x" * (16 * 1024)})
        assert r.status_code == 413
        for q in ("offset=9223372036854775808", "offset=-1", "limit=99999999999999999999", "limit=0"):
            r = c.get("/admin/v1/tenants?" + q)
            assert r.status_code in (400, 422), (q, r.status_code, r.text)
        tid = c.post("/admin/v1/tenants", json={"name": "ovf"}).json()["id"]
        for field in ("rpm", "tpm", "max_concurrent", "token_budget"):
            r = c.put(f"/admin/v1/tenants/{tid}/quota", json={field: 2**63})
            assert r.status_code in (400, 422), (field, r.text)
            r = c.put(f"/admin/v1/tenants/{tid}/quota", json={field: 2**31 - 1})
            assert r.status_code == 200, (field, r.text)
        for q in ("since=9999-12-31T23:59:59-23:00", "until=0001-01-01T00:00:00%2B23:00", "group_by=year"):
            r = c.get("/admin/v1/usage?" + q)
            assert r.status_code < 500, (q, r.status_code, r.text)


def test_a_body_that_trickles_in_is_dropped_with_408(live):
    _tid, key = new_tenant(live.url, "slow")
    host, port = live.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(60)
    sock.sendall(
        (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        ).encode()
    )
    got = b""
    deadline = time.monotonic() + 60
    while b"\r\n\r\n" not in got and time.monotonic() < deadline:
        try:
            sock.sendall(b" ")  # one byte at a time, never the whole body
        except OSError:
            break
        time.sleep(0.2)
        sock.setblocking(False)
        try:
            got += sock.recv(65536)
        except (BlockingIOError, OSError):
            pass
        sock.setblocking(True)
    sock.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
