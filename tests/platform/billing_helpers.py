"""Helpers for the billing / control-plane tests: tenants over HTTP, SSE streams read by hand."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx
from platform_helpers import admin_headers, zip_bytes

H = admin_headers()


def new_tenant(url: str, name: str, *, quota: dict | None = None, timeout: float = 30) -> tuple[str, str]:
    with httpx.Client(base_url=url, headers=H, timeout=timeout) as c:
        tid = c.post("/admin/v1/tenants", json={"name": name}).json()["id"]
        key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
        if quota:
            assert c.put(f"/admin/v1/tenants/{tid}/quota", json=quota).status_code == 200
    return tid, key


def new_adapter(url: str, name: str, tid: str, files: dict[str, bytes]) -> str:
    r = httpx.post(
        url + "/admin/v1/adapters",
        data={"name": name, "tenant_id": tid},
        files={"file": (f"{name}.zip", zip_bytes(files))},
        headers=H,
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass
class StreamResult:
    status: int
    request_id: str | None = None
    text: str = ""
    chunks: int = 0  # content chunks received
    finish_reason: str | None = None
    error: dict | None = None
    done: bool = False
    usage: dict | None = None
    ended_at: float = 0.0
    events: list = field(default_factory=list)


def stream(
    url: str,
    key: str,
    model: str,
    *,
    prompt: str = "Once upon a time",
    max_tokens: int = 64,
    on_chunk=None,
    timeout: float = 60,
    **extra,
) -> StreamResult:
    """A /v1/completions stream read event by event; ``on_chunk(result)`` runs after each chunk."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    with (
        httpx.Client(timeout=timeout) as c,
        c.stream("POST", url + "/v1/completions", json=body, headers=auth(key)) as r,
    ):
        res = StreamResult(r.status_code)
        if r.status_code != 200:
            r.read()
            res.error = r.json().get("error")
            return res
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                res.done = True
                break
            event = json.loads(data)
            if "error" in event:
                res.error = event["error"]
                continue
            res.request_id = event["id"].removeprefix("cmpl-")
            if event.get("usage"):
                res.usage = event["usage"]
            for ch in event.get("choices", []):
                if ch.get("text"):
                    res.text += ch["text"]
                    res.chunks += 1
                if ch.get("finish_reason"):
                    res.finish_reason = ch["finish_reason"]
            if on_chunk is not None:
                on_chunk(res)
        res.ended_at = time.monotonic()
        return res


def usage_rows(url: str, tenant_id: str | None = None, *, timeout: float = 30) -> dict[str, dict]:
    """Every usage record (the JSON lines export), by request id."""
    params = {"format": "jsonl", **({"tenant_id": tenant_id} if tenant_id else {})}
    r = httpx.get(url + "/admin/v1/usage/export", params=params, headers=H, timeout=timeout)
    assert r.status_code == 200, r.text
    rows = [json.loads(line) for line in r.text.splitlines() if line]
    return {row["request_id"]: row for row in rows}
