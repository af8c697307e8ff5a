"""The request kinds of the chaos soak (chaos.py) and what each client saw of its answer.

Completions ask for ``logprobs`` so the client counts the tokens it received one by one (an oracle
independent of the ``usage`` field the server reports); chat kinds (tools, json_schema) rely on
``usage``. Hostile kinds must be refused with a 4xx (never a 5xx, never a hang)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

KINDS = ("stream", "plain", "n3", "list", "tools", "json", "leave", "stream_n2", "hostile")
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {}}}}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
SURROGATE = "\ud800"


def hostile_bodies(model: str) -> list[tuple[str, bytes]]:
    """Bodies a hostile tenant sends (raw bytes: json.dumps escapes the lone surrogates)."""
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": "' + SURROGATE + '"}'}}
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]
    bodies = [
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 4, "user": SURROGATE}),
        ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 4}),
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2**63}),
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 4, "n": 10**9}),
        ("/v1/completions", {"model": "m\u0000", "prompt": "hi", "max_tokens": 4}),
        ("/tokenize", {"model": model, "prompt": "x" + SURROGATE}),
        (
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
        ),
    ]
    return [(path, json.dumps(body).encode()) for path, body in bodies]


@dataclass
class Outcome:
    kind: str
    tenant: int
    server: str = ""
    status: int = 0
    request_id: str | None = None
    usage: int | None = None  # completion tokens the response said it delivered
    received: int | None = None  # completion tokens the client counted (logprobs; first prompt of a list)
    complete: bool = False
    cut: bool = False  # a stream that broke after some tokens (server killed under it)
    hung: bool = False  # no answer within the client timeout (soak_chaos discounts machine pauses)
    error: str = ""
    started: float = 0.0
    ended: float = 0.0


def body(kind: str, model: str, max_tokens: int) -> tuple[str, dict]:
    chat = {"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": max_tokens}
    comp = {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens, "logprobs": 1}
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    if kind == "stream":
        return "/v1/completions", {**comp, **stream, "max_tokens": max_tokens * 4}
    if kind == "stream_n2":
        return "/v1/completions", {**comp, **stream, "n": 2}
    if kind == "n3":
        return "/v1/completions", {**comp, "n": 3}
    if kind == "list":
        return "/v1/completions", {**comp, "prompt": ["One", "Two two"]}
    if kind == "tools":
        return "/v1/chat/completions", {**chat, "tools": TOOLS}
    if kind == "json":
        schema = {"name": "a", "schema": SCHEMA}
        return "/v1/chat/completions", {**chat, "response_format": {"type": "json_schema", "json_schema": schema}}
    if kind == "leave":  # a non-streaming client that gives up (its read timeout) mid-answer
        return "/v1/completions", {**comp, "max_tokens": max_tokens * 40, "ignore_eos": True}
    return "/v1/completions", comp


def _count(choice: dict) -> int:
    return len((choice.get("logprobs") or {}).get("tokens") or [])


def send(url: str, key: str, model: str, kind: str, tenant: int, max_tokens: int, n: int) -> Outcome:
    """One request of ``kind`` (the n-th of its client: hostile kinds cycle through their bodies)."""
    out = Outcome(kind, tenant, server=url, started=time.monotonic())
    try:
        return _send(out, url, key, model, kind, max_tokens, n)
    finally:
        out.ended = time.monotonic()


def _send(out: Outcome, url: str, key: str, model: str, kind: str, max_tokens: int, n: int) -> Outcome:
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    if kind == "hostile":
        bodies = hostile_bodies(model)
        path, content = bodies[n % len(bodies)]
    else:
        path, payload = body(kind, model, max_tokens)
        content = json.dumps(payload).encode()
    timeout = httpx.Timeout(2 if kind == "leave" else 180, connect=5)
    try:
        with httpx.Client(timeout=timeout) as c:
            if kind.startswith("stream"):
                with c.stream("POST", url + path, content=content, headers=headers) as r:
                    out.status = r.status_code
                    if r.status_code != 200:
                        r.read()
                        return out
                    out.received = 0
                    for line in r.iter_lines():
                        if line == "data: [DONE]":
                            out.complete = out.usage is not None
                        elif line.startswith("data: {"):
                            ev = json.loads(line[6:])
                            if "error" in ev:
                                out.error = str(ev["error"].get("code"))
                                continue
                            out.request_id = ev.get("id", "").removeprefix("cmpl-") or out.request_id
                            if ev.get("usage"):
                                out.usage = ev["usage"]["completion_tokens"]
                            out.received += sum(_count(ch) for ch in ev.get("choices", []))
                    out.cut = not out.complete and out.received > 0
                return out
            r = c.post(url + path, content=content, headers=headers)
            out.status = r.status_code
            if r.status_code == 200 and kind != "hostile" and path != "/tokenize":
                data = r.json()
                out.request_id = data["id"].split("-", 1)[1]
                out.usage = data["usage"]["completion_tokens"]
                choices = data["choices"]
                if path == "/v1/completions":
                    first = choices[:1] if kind == "list" else choices  # a list: the first prompt's id only
                    out.received = sum(_count(ch) for ch in first)
                    if kind == "list":
                        out.usage = out.received
                else:
                    out.received = out.usage
                out.complete = True
    except httpx.ReadTimeout:
        out.hung = kind != "leave"  # the leaver gives up on purpose
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        out.status = out.status or -1  # the server died under it (kill -9) or was not up yet
        out.error = type(exc).__name__
        if kind.startswith("stream") and out.received:
            out.cut = True
    return out
