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
        (
            "responses",
            {"model": "bot", "input": "x", "previous_response_id": "resp_" + "a" * 5000},
            400,
        ),  # no id is this long
        ("responses", {"model": "bot", "input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "tools": TOOLS * 129}, 400),
        (
            "chat/completions",
            # a lone surrogate anywhere in a request is refused before admission (issue 18's text guard)
            {"model": "bot", "messages": USER, "chat_template_kwargs": {"x": "\ud800"}, "max_tokens": 2},
            400,
        ),
        ("chat/completions", {"model": "bot", "messages": USER, "allowed_token_ids": [2**70]}, 400),
        (  # a lone surrogate in a tool's name or in a call's arguments: refused, never a 500
            "chat/completions",
            {"model": "bot", "messages": USER, "tools": [{"type": "function", "function": {"name": "f\ud800"}}]},
            400,
        ),
        (
            "chat/completions",
            {
                "model": "bot",
                "tools": TOOLS,
                "messages": USER
                + [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": "\ud800"}'}}
                        ],
                    }
                ],
            },
            400,
        ),
        ("chat/completions", {"model": "bot", "messages": USER, "prompt_logprobs": 2**70}, 400),
        ("completions", {"model": "bot", "prompt": "x", "prompt_logprobs": -1}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "bad_words": ["\ud800"], "max_tokens": 2}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "structured_outputs": {"regex": "("}}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "guided_choice": []}, 400),
        ("chat/completions", {"model": "bot", "messages": USER, "truncate_prompt_tokens": 2**70, "max_tokens": 2}, 200),
        ("chat/completions", {"model": "bot", "messages": USER, "skip_special_tokens": False}, 400),
        ("completions", {"model": "bot", "prompt": "x", "min_tokens": 2**70}, 400),
    ],
)
def test_hostile_bodies(module_tenant_setup, path, body, status):
    r = _post(module_tenant_setup, path, body)
    assert r.status_code == status, r.text
    if status >= 400:
        err = r.json()["error"]
        assert err["message"] and err["type"]


def test_n_choices_stream_tools_independently(module_tenant_setup):
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
    _, url, _, key, _, _ = module_tenant_setup
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


def _forced(call: str) -> str:
    return call.replace("{", "\\{").replace("}", "\\}")


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_to_a_tool_that_was_not_offered_is_text(module_tenant_setup, stream):
    """The model writes a Hermes call to ``g`` while only ``f`` is offered (forced by a regex): no
    choice returns it as a call, streamed or not, with n > 1; the text comes back as content."""
    call = '<tool_call>{"name": "g", "arguments": {"a": 1}}</tool_call>'
    body = {
        "model": "bot",
        "messages": USER,
        "tools": TOOLS,
        "n": 2,
        "stream": stream,
        "max_tokens": 300,
        "guided_regex": _forced(call),
    }
    _, url, _, key, _, _ = module_tenant_setup
    content: dict[int, str] = {0: "", 1: ""}
    reasons: dict[int, str] = {}
    headers = {"authorization": f"Bearer {key}"}
    if not stream:
        r = httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body, timeout=120)
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            assert "tool_calls" not in c["message"], c
            content[c["index"]], reasons[c["index"]] = c["message"]["content"], c["finish_reason"]
    else:
        with httpx.stream("POST", f"{url}/v1/chat/completions", headers=headers, json=body, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for c in json.loads(line[6:])["choices"]:
                    assert not c["delta"].get("tool_calls"), c
                    content[c["index"]] += c["delta"].get("content") or ""
                    if c["finish_reason"]:
                        reasons[c["index"]] = c["finish_reason"]
    assert content == {0: call, 1: call} and reasons == {0: "stop", 1: "stop"}


def test_prompt_logprobs_with_tools_n_and_an_adapter(module_tenant_setup):
    """prompt_logprobs combined with tools (a forced call), n > 1, an adapter and a JSON schema on a
    second prompt: one list per response, as long as the rendered prompt, and the call still parsed."""
    call = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    body = {
        "model": "bot",
        "messages": USER,
        "tools": TOOLS,
        "n": 3,
        "max_tokens": 300,
        "guided_regex": _forced(call),
        "prompt_logprobs": 2,
    }
    r = _post(module_tenant_setup, "chat/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["prompt_logprobs"]) == out["usage"]["prompt_tokens"] and out["prompt_logprobs"][0] is None
    assert all(c["message"]["tool_calls"][0]["function"]["name"] == "f" for c in out["choices"])
    schema = {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}
    r = _post(
        module_tenant_setup,
        "completions",
        {
            "model": "bot",
            "prompt": ["x y", "a b c d"],
            "max_tokens": 20,
            "prompt_logprobs": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        },
    )
    assert r.status_code == 200, r.text
    lens = [len(c["prompt_logprobs"]) for c in r.json()["choices"]]
    assert lens[0] < lens[1] and all(isinstance(json.loads(c["text"])["b"], bool) for c in r.json()["choices"])
