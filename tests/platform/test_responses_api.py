"""/v1/responses through the official `openai` client against a real uvicorn: text and message
input, instructions, streaming events, function tools, text.format, max_output_tokens, usage billed
like chat (the usage ledger is the oracle), stored responses per tenant (another tenant reads 404).
"""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest
from platform_helpers import admin_headers

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "name": "get_weather", "description": "weather", "parameters": WEATHER}]


def _ledger(url: str, tid: str, requests: int) -> dict[str, int]:
    """What the usage ledger billed this tenant, once it holds ``requests`` final records."""
    deadline = time.time() + 30
    while True:
        r = httpx.get(f"{url}/admin/v1/usage", params={"tenant_id": tid}, headers=admin_headers(), timeout=30)
        assert r.status_code == 200, r.text
        totals = r.json()["totals"]
        if totals["requests"] >= requests or time.time() > deadline:
            return totals


def test_text_input_instructions_usage_and_storage(tenant_setup):
    ctx, url, tid, key, _, client = tenant_setup
    r = client.responses.create(model="bot", input="Hello there", instructions="Be terse.", max_output_tokens=6)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete") and r.output[0].type == "message"
    assert r.output_text == r.output[0].content[0].text
    assert 1 <= r.usage.output_tokens <= 6 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # the chat path with the same messages prompts the same number of tokens
    chat = client.chat.completions.create(
        model="bot",
        messages=[{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello there"}],
        max_tokens=1,
    )
    assert chat.usage.prompt_tokens == r.usage.input_tokens
    billed = _ledger(url, tid, 2)
    assert billed["requests"] == 2
    assert billed["prompt_tokens"] == r.usage.input_tokens + chat.usage.prompt_tokens
    assert billed["completion_tokens"] == r.usage.output_tokens + chat.usage.completion_tokens
    # stored: readable by its tenant, continued with previous_response_id, deleted
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    follow = client.responses.create(model="bot", input="And now?", previous_response_id=r.id, max_output_tokens=2)
    expected = ctx.engine.tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": r.output_text},
            {"role": "user", "content": "And now?"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert follow.usage.input_tokens == len(ctx.engine.tokenizer.encode(expected, add_special_tokens=False))
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="bot", input="x", previous_response_id=r.id)


def test_another_tenant_never_reads_a_stored_response(tenant_setup):
    _, url, tid, key, _, client = tenant_setup
    r = client.responses.create(model="bot", input="secret", max_output_tokens=2)
    with httpx.Client(base_url=url, headers=admin_headers(), timeout=30) as c:
        other = c.post("/admin/v1/tenants", json={"name": "other"}).json()["id"]
        other_key = c.post(f"/admin/v1/tenants/{other}/keys", json={}).json()["key"]
    spy = openai.OpenAI(base_url=url + "/v1", api_key=other_key, max_retries=0)
    base = tenant_setup[0].engine.model_name
    with pytest.raises(openai.NotFoundError):
        spy.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        spy.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        spy.responses.create(model=base, input="x", previous_response_id=r.id)
    assert client.responses.retrieve(r.id).id == r.id  # still there for its owner
    unstored = client.responses.create(model="bot", input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_streaming_events_assemble_to_the_response(tenant_setup):
    *_, client = tenant_setup
    # ASCII JSON (grammar-constrained): every token is text a chunk can carry; a random model's
    # free text may be bytes held back until a character completes
    fmt = {
        "format": {
            "type": "json_schema",
            "name": "n",
            "schema": {"type": "object", "properties": {"n": {"type": "array", "items": {"enum": [1, 22, 333]}}}},
        }
    }
    events = list(
        client.responses.create(
            model="bot",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Tell me"}]}],
            max_output_tokens=40,
            temperature=0,
            stream=True,
            text=fmt,
        )
    )
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    # at least one delta: the engine coalesces queued deltas for a reader that lags (on a loaded
    # machine all of them can arrive as one), so the count is not a property of the API
    assert types.count("response.output_text.delta") >= 1
    final = events[-1].response
    assert final.output_text == text and [e.sequence_number for e in events] == list(range(len(events)))
    plain = client.responses.create(model="bot", input="Tell me", max_output_tokens=40, temperature=0, text=fmt)
    assert plain.output_text == text  # same greedy answer streamed or not


def test_function_tools_round_trip_and_structured_text(tenant_setup):
    *_, client = tenant_setup
    r = client.responses.create(
        model="bot",
        input="Weather in Paris?",
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=1.0,
    )
    call = [o for o in r.output if o.type == "function_call"][0]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    # streamed: function-call argument events assemble to the arguments
    events = list(
        client.responses.create(
            model="bot",
            input="Weather in Paris?",
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=200,  # the call in the model's own (Hermes) form
            stream=True,
        )
    )
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].arguments == args
    jsonschema.validate(json.loads(args), WEATHER)
    # the tool's answer goes back as function_call_output
    follow = client.responses.create(
        model="bot",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'},
        ],
        tools=TOOLS,
        max_output_tokens=4,
    )
    assert follow.status in ("completed", "incomplete")
    person = {"type": "object", "properties": {"b": {"type": "boolean"}, "a": {"enum": [1, 2]}}, "required": ["b", "a"]}
    s = client.responses.create(
        model="bot",
        input="data",
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "p", "schema": person}},
    )
    assert list(json.loads(s.output_text)) == ["b", "a"]


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
        ({"temperature": 5}, "temperature"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
    ],
)
def test_refusals_are_400_naming_the_field(tenant_setup, extra, param):
    _, url, _, key, _, _ = tenant_setup
    r = httpx.post(
        f"{url}/v1/responses",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "bot", "input": "x", **extra},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
