"""Hostile tool grammars (hostile3 review): each request is a 4xx with an OpenAI error body or a
well-formed answer, never a 5xx or a hang (a request timing out is a finding)."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

pytestmark = pytest.mark.slow
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
LOG: list[str] = []


def fn(name, params=None):
    return {"type": "function", "function": {"name": name, "parameters": params or {"type": "object"}}}


def nested(depth):
    s: dict = {"type": "string"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


RECURSIVE = {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}, "required": ["next"]}
DEFS_LOOP = {
    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
    "type": "object",
    "properties": {"x": {"$ref": "#/$defs/a"}},
    "required": ["x"],
}
CLOSED = {"type": "object", "properties": {}, "additionalProperties": False}
BIG_ENUM = {"type": "object", "properties": {"c": {"enum": [f"v{i}" for i in range(10000)]}}, "required": ["c"]}

CASES = {
    "200 tools": {"tools": [fn(f"f{i}") for i in range(200)]},
    "128 tools required": {"tools": [fn(f"f{i}") for i in range(128)], "tool_choice": "required"},
    "nested depth 60 required": {"tools": [fn("deep", nested(60))], "tool_choice": "required"},
    "nested depth 300 required": {"tools": [fn("deep", nested(300))], "tool_choice": "required"},
    "nested depth 5000 (raw text)": {"tools": [fn("deep", "DEEP")], "tool_choice": "required"},
    # response_format schemas are not rendered into the prompt: the grammar compiler meets them whole
    "auto + response_format enum 10k": {
        "tools": [fn("a")],
        "tool_choice": "auto",
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": BIG_ENUM}},
    },
    "auto + response_format nested 250": {
        "tools": [fn("a")],
        "tool_choice": "auto",
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": nested(250)}},
    },
    "auto + response_format recursive $ref": {
        "tools": [fn("a")],
        "tool_choice": "auto",
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": RECURSIVE}},
    },
    "none + response_format enum 100k": {
        "tools": [fn("a")],
        "tool_choice": "none",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": {"enum": [f"v{i}" for i in range(100000)]}},
        },
    },
    # parameters that admit only {}: the call completes, so the parser meets the odd name whole
    "closed: name </tool_call> required": {"tools": [fn("</tool_call>", CLOSED)], "tool_choice": "required"},
    "closed: name </tool_call> stream": {
        "tools": [fn("</tool_call>", CLOSED)],
        "tool_choice": "required",
        "stream": True,
    },
    "closed: name regex metachars": {"tools": [fn('a.*|(b)[c]{2}\\"', CLOSED)], "tool_choice": "required"},
    "closed: name with quote+brace auto": {"tools": [fn('x"}, {"name": "y', CLOSED)], "tool_choice": "auto"},
    "closed: NUL name required": {"tools": [fn("a\x00b", CLOSED)], "tool_choice": "required"},
    "closed: parallel false n=4": {
        "tools": [fn("a", CLOSED), fn("b", CLOSED)],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "n": 4,
    },
    "closed: parallel true n=2 stream": {
        "tools": [fn("a", CLOSED), fn("b", CLOSED)],
        "tool_choice": "required",
        "n": 2,
        "stream": True,
    },
    "recursive $ref required": {"tools": [fn("rec", RECURSIVE)], "tool_choice": "required"},
    "$defs a->b->a required": {"tools": [fn("loop", DEFS_LOOP)], "tool_choice": "required"},
    "enum 10k required": {"tools": [fn("big", BIG_ENUM)], "tool_choice": "required"},
    "enum 10k auto": {"tools": [fn("big", BIG_ENUM)], "tool_choice": "auto"},
    "name regex metachars": {"tools": [fn('a.*|(b)[c]{2}\\"')], "tool_choice": "required"},
    "name </tool_call>": {"tools": [fn("</tool_call>")], "tool_choice": "required"},
    "name with </tool_call> inside auto": {"tools": [fn("x</tool_call><tool_call>")], "tool_choice": "auto"},
    "property named </tool_call>": {
        "tools": [
            fn(
                "p",
                {
                    "type": "object",
                    "properties": {"</tool_call>": {"type": "string", "pattern": "^</tool_call>$"}},
                    "required": ["</tool_call>"],
                },
            )
        ],
        "tool_choice": "required",
    },
    "bad pattern in schema": {
        "tools": [fn("p", {"type": "object", "properties": {"s": {"type": "string", "pattern": "("}}})],
        "tool_choice": "required",
    },
    "parallel false n=4 stream": {
        "tools": [fn("a"), fn("b")],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "n": 4,
        "stream": True,
    },
    "parallel false n=4": {"tools": [fn("a"), fn("b")], "tool_choice": "auto", "parallel_tool_calls": False, "n": 4},
    "required + response_format + stream": {
        "tools": [fn("a")],
        "tool_choice": "required",
        "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
    },
    "auto + json_object + stream": {
        "tools": [fn("a")],
        "tool_choice": "auto",
        "stream": True,
        "response_format": {"type": "json_object"},
    },
    "tool_choice names missing tool": {
        "tools": [fn("a")],
        "tool_choice": {"type": "function", "function": {"name": "zz"}},
    },
    "tool_choice required, no tools": {"tool_choice": "required"},
    "tool_choice garbage": {"tools": [fn("a")], "tool_choice": "sometimes"},
    "duplicate tool names": {
        "tools": [fn("a"), fn("a", {"type": "object", "properties": {"x": {"type": "integer"}}})],
        "tool_choice": "required",
    },
    "parameters not an object": {"tools": [fn("a", {"type": "string"})], "tool_choice": "required"},
    "parameters false": {
        "tools": [{"type": "function", "function": {"name": "a", "parameters": False}}],
        "tool_choice": "required",
    },
    "empty tool name": {"tools": [fn("")], "tool_choice": "required"},
    "10k-char tool name": {"tools": [fn("n" * 10000)], "tool_choice": "required"},
    "NUL in tool name": {"tools": [fn("a\x00b")], "tool_choice": "required"},
}


@pytest.mark.parametrize("name", list(CASES))
def test_tool_probe(module_tenant_setup, name):
    _, url, _, key, _, _ = module_tenant_setup
    body = {"model": "bot", "messages": USER, "max_tokens": 200, "temperature": 0, **CASES[name]}
    t0 = time.monotonic()
    try:
        raw = json.dumps(body)
        if name == "nested depth 5000 (raw text)":  # deeper than json.dumps recurses: written by hand
            raw = raw.replace(
                '"DEEP"', '{"type":"object","properties":{"a":' * 5000 + '{"type":"string"}' + "}}" * 5000
            )
        with (
            httpx.Client(timeout=180) as c,
            c.stream(
                "POST",
                f"{url}/v1/chat/completions",
                content=raw,
                headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            ) as r,
        ):
            text = r.read().decode(errors="replace")
        status = r.status_code
    except httpx.TimeoutException:
        status, text = "TIMEOUT", ""
    summary = ""
    if status == 200 and not body.get("stream"):
        summary = str(
            [
                (c["finish_reason"], [t["function"]["name"] for t in c["message"].get("tool_calls") or []])
                for c in json.loads(text)["choices"]
            ]
        )
    elif status == 200:
        summary = str(_stream_calls(text))
    LOG.append(f"{name} | {status} | {time.monotonic() - t0:.1f}s | {summary} {text[:160]}".replace("\n", " "))
    assert status != "TIMEOUT" and status < 500, text[:500]
    # a name outside OpenAI's ^[a-zA-Z0-9_-]{1,64}$ (metacharacters, NUL, empty, 10k chars) is
    # refused before it reaches the template or the grammar: a 400 that names it
    odd = [
        i
        for i, t in enumerate(body.get("tools", []))
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", t["function"]["name"])
    ]
    if odd:
        assert status == 400, text[:500]
        assert json.loads(text)["error"]["param"] == f"tools[{odd[0]}].function.name", text[:500]
    if status == 200 and not body.get("stream") and name != "nested depth 5000 (raw text)":
        j = json.loads(text)
        for ch in j["choices"]:
            for call in ch["message"].get("tool_calls") or []:
                assert call["function"]["name"] in {t["function"]["name"] for t in body["tools"]}
                json.loads(call["function"]["arguments"])
            if body.get("parallel_tool_calls") is False:
                assert len(ch["message"].get("tool_calls") or []) <= 1
    if status == 200 and body.get("stream"):
        assert "data: [DONE]" in text
        offered = {t["function"]["name"] for t in body.get("tools", [])}
        for calls in _stream_calls(text).values():
            assert set(calls.values()) <= offered, calls
            if body.get("parallel_tool_calls") is False:
                assert len(calls) <= 1, calls


def _stream_calls(text: str) -> dict[int, dict[int, str]]:
    """choice index -> tool call index -> name, from an SSE body."""
    calls: dict[int, dict[int, str]] = {}
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        for ch in json.loads(line[6:]).get("choices", []):
            for tc in (ch.get("delta") or {}).get("tool_calls") or []:
                got = calls.setdefault(ch["index"], {})
                name = (tc.get("function") or {}).get("name")
                got[tc["index"]] = name or got.get(tc["index"], "")
    return calls


def teardown_module(module):
    with open("/tmp/h3-tools.log", "a") as f:
        f.write("\n".join(LOG) + "\n")
