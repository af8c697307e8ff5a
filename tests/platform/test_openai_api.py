"""The tenant-facing OpenAI API, driven by the official `openai` client against a real uvicorn."""

from __future__ import annotations

import httpx
import openai
import pytest
from platform_helpers import admin_headers

H = admin_headers()


def test_models_completions_and_chat(tenant_setup):
    ctx, url, tid, key, ada, client = tenant_setup
    base = ctx.engine.model_name
    assert [m.id for m in client.models.list().data] == [base, "bot"]
    r = client.completions.create(model=base, prompt="Hello, world.", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens >= 1
    lora = client.completions.create(model="bot", prompt="Hello, world.", max_tokens=5, temperature=0)
    assert lora.usage.prompt_tokens == r.usage.prompt_tokens
    chat = client.chat.completions.create(
        model="bot", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
    )
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens >= 1


def test_streaming_matches_non_streaming(tenant_setup):
    *_, client = tenant_setup
    msgs = [{"role": "user", "content": "Tell me about the scheduler"}]
    full = client.chat.completions.create(model="bot", messages=msgs, max_tokens=8, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="bot", messages=msgs, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="bot", prompt="abc", max_tokens=6, temperature=0, stream=True)
    )
    assert streamed == client.completions.create(model="bot", prompt="abc", max_tokens=6, temperature=0).choices[0].text


def test_errors_and_usage_records(tenant_setup):
    ctx, url, tid, key, ada, client = tenant_setup
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="bot", prompt="", max_tokens=2)
    with pytest.raises(openai.BadRequestError):  # OpenAI's contract: a bad value is a 400
        client.completions.create(model="bot", prompt="x", max_tokens=0)
    bad = openai.OpenAI(base_url=url + "/v1", api_key="lpx-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    client.completions.create(model="bot", prompt="x", max_tokens=3, temperature=0)
    ctx.ledger.flush()
    rep = httpx.get(url + f"/admin/v1/usage?tenant_id={tid}&group_by=adapter", headers=H).json()
    assert {b["key"]: b["requests"] for b in rep["data"]} == {"bot": 1}
    assert rep["totals"]["completion_tokens"] >= 1


def test_quota_429_with_headers(tenant_setup):
    ctx, url, tid, key, ada, client = tenant_setup
    httpx.put(url + f"/admin/v1/tenants/{tid}/quota", json={"rpm": 2}, headers=H)
    r = client.completions.with_raw_response.create(model="bot", prompt="x", max_tokens=1)
    assert r.headers["x-ratelimit-limit-requests"] == "2"
    client.completions.create(model="bot", prompt="x", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as e:
        client.completions.create(model="bot", prompt="x", max_tokens=1)
    assert int(e.value.response.headers["retry-after"]) >= 1
    assert e.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    httpx.put(url + f"/admin/v1/tenants/{tid}/quota", json={"token_budget": 1, "budget_period": "day"}, headers=H)
    with pytest.raises(openai.RateLimitError) as e:
        client.completions.create(model="bot", prompt="x", max_tokens=1)
    assert e.value.body["code"] == "insufficient_quota"
