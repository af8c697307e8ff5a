"""Hostile requests against the tool / Responses / extension surface: every one is a 4xx with an
OpenAI error body or a well-formed answer, never a 500 or a hang."""

from __future__ import annotations

import json

import httpx
import pytest

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
USER = [{"role": "user", "content": "hi"}]


def _post(setup, path, body):
    _, url, _, key, _, _ = setup
    return httpx.post(  # json.dumps escapes lone surrogates as \ud800, as a hostile client may send them
        f"{url}/v1/{path}",
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        content=json.dumps(body),
        timeout=120,
    )


@pytest.mark.parametrize(
    "path,body,status",
    [
        ("responses", {"model": "bot", "input": "\ud800 lone"}, 400),
        (
            "responses",
            {"model": "bot", "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
            400,
        ),
        ("responses", {"model": "bot", "input": []}, 400),
        ("responses", {"model": "bot", "input": "x", "max_output_tokens": 2**70}, 400),
        (
            "responses",
            {
                "model": "bot",
                "input": "x",
                "tool_choice": {"type": "function", "name": "zz"},
                "tools": [{"type": "function", "name": "f"}],
            },
            400,
        ),
        ("responses", {"model": "bot", "input": "x", "previous_response_id": "resp_" + "a" * 5000}, 404),
        ("responses", {"model": "bot", "input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "tools": TOOLS * 129}, 400),
        (
            "chat/completions",
            # a lone surrogate anywhere in a request is refused before admission (issue 18's text guard)
            {"model": "bot", "messages": USER, "chat_template_kwargs": {"x": "\ud800"}, "max_tokens": 2},
            400,
        ),
        ("chat/completions", {"model": "bot", "messages": USER, "allowed_token_ids": [2**70]}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "bad_words": ["\ud800"], "max_tokens": 2}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "structured_outputs": {"regex": "("}}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "guided_choice": []}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "truncate_prompt_tokens": 2**70, "max_tokens": 2}, 200),
        ("chat/completions", {"model": "bot", "messages": USER, "skip_special_tokens": False}, 400),
        ("completions", {"model": "bot", "prompt": "x", "min_tokens": 2**70}, 400),
    ],
)
def test_hostile_bodies(tenant_setup, path, body, status):
    r = _post(tenant_setup, path, body)
    assert r.status_code == status, r.text
    if status >= 400:
        err = r.json()["error"]
        assert err["message"] and err["type"]


def test_n_choices_stream_tools_independently(tenant_setup):
    """n > 1 with tools offered and a forced Hermes call: each choice streams its own call."""
    call = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    body = {
        "model": "bot",
        "messages": USER,
        "tools": TOOLS,
        "n": 3,
        "stream": True,
        "max_tokens": 300,
        "guided_regex": call.replace("{", "\\{").replace("}", "\\}"),
    }
    _, url, _, key, _, _ = tenant_setup
    calls: dict[int, dict] = {}
    reasons: dict[int, str] = {}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body, timeout=120
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk["choices"]:
                for tc in c["delta"].get("tool_calls") or []:
                    slot = calls.setdefault(c["index"], {"name": None, "args": ""})
                    slot["name"] = tc["function"].get("name") or slot["name"]
                    slot["args"] += tc["function"].get("arguments", "")
                if c["finish_reason"]:
                    reasons[c["index"]] = c["finish_reason"]
    assert sorted(calls) == [0, 1, 2] and reasons == {0: "tool_calls", 1: "tool_calls", 2: "tool_calls"}
    assert all(c["name"] == "f" and json.loads(c["args"]) == {"a": 1} for c in calls.values())
