"""Hostile combinations, where two features meet, on a real uvicorn server hit by real clients: each
test here reproduced a failure a hostile tester found (it failed before its fix)."""

from __future__ import annotations

import httpx
import openai
import pytest
from billing_helpers import new_tenant
from platform_helpers import admin_headers

from loraplex.platform.inference.tool_parsers import get_parser
from loraplex.platform.inference.tools import ToolPlan, ToolStream

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# What the grammar of a required call (parallel calls off; the served parser's Hermes form) forces
# before the model writes the city.
CALL_PREFIX = '<tool_call>\n{"name": "get_weather", "arguments": '


@pytest.fixture
def live(live_factory):
    return live_factory()


@pytest.mark.parametrize("bound", ["since", "until"])
@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+14:00"])
def test_usage_series_refuses_a_time_with_no_utc_equivalent(live, bound, when):
    """/admin/v1/usage and /usage/export answered 422 for these, /usage/series a 500 (SQL overflow)."""
    for path in ("/admin/v1/usage", "/admin/v1/usage/series"):
        r = httpx.get(live.url + path, params={bound: when}, headers=admin_headers(), timeout=60)
        assert r.status_code == 422, (path, r.status_code, r.text)
        err = r.json()["error"]
        assert err["param"] == bound and "UTC" in err["message"]


def _stream_choices(client: openai.OpenAI, body: dict) -> dict[int, dict]:
    choices: dict[int, dict] = {}
    for chunk in client.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            slot = choices.setdefault(c.index, {"content": "", "calls": {}, "finish": None})
            slot["content"] += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                call = slot["calls"].setdefault(tc.index, {"name": "", "args": ""})
                call["name"] += (tc.function.name or "") if tc.function else ""
                call["args"] += (tc.function.arguments or "") if tc.function else ""
            slot["finish"] = c.finish_reason or slot["finish"]
    return choices


def test_a_required_call_cut_by_max_tokens_is_not_streamed_twice(live):
    """tool_choice=required, cut by max_tokens inside the arguments: the stream had already sent the
    call (name, then the arguments so far), and at the end sent the same text again as `content`."""
    _, key = new_tenant(live.url, "cut")
    model = live.ctx.engine.model_name
    prefix = httpx.post(
        live.url + "/tokenize",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "prompt": CALL_PREFIX + '{"city": "'},
        timeout=60,
    ).json()["count"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "n": 4,
        "seed": 7,
        "temperature": 1.0,
        "max_tokens": prefix + 3,  # the name is complete; the city is being written
    }
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=120)
    whole = client.chat.completions.create(**body)  # the same seeds: the same tokens (the oracle)
    streamed = _stream_choices(client, body)
    cut = 0
    for c in whole.choices:
        s = streamed[c.index]
        assert s["finish"] == c.finish_reason
        if c.finish_reason != "length" or c.message.tool_calls:
            continue
        cut += 1  # cut inside the call: the whole answer is its text (no complete call)
        text = c.message.content or ""
        assert text.startswith(CALL_PREFIX)
        assert s["calls"] == {0: {"name": "get_weather", "args": text[len(CALL_PREFIX) :]}}, (s, text)
        assert s["content"] == "", f"the streamed call was sent again as content: {s['content']!r}"
    assert cut >= 1, "no choice was cut inside its call: the test did not exercise the case"


def test_hermes_call_cut_by_max_tokens_stays_a_call_in_the_stream():
    """The same for `auto` with the Hermes parser: text, a call that streams, then max_tokens."""
    plan = ToolPlan("auto", None, None, [], get_parser("hermes"), True)
    stream = ToolStream(plan)
    pieces = ["Let me check. ", "<tool_call>", '{"name": "get_weather", ', '"arguments": {"city": "Pa']
    deltas = [stream.delta(p, None)[0] for p in pieces] + [stream.delta("", "length")[0]]
    content = "".join(d.get("content", "") for d in deltas if d)
    calls = [tc for d in deltas if d for tc in d.get("tool_calls", [])]
    assert content == "Let me check. "
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(tc["function"].get("arguments", "") for tc in calls) == '{"city": "Pa'


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is the weather?"}]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"tools": [WEATHER]},
        {"add_generation_prompt": False},
        {"chat_template_kwargs": {"note": "x"}},
        {"documents": [{"title": "t", "text": "some document text"}]},
        # /tokenize ignored this one: it counted the closed assistant turn (2 tokens more than billed)
        {
            "messages": [*MESSAGES, {"role": "assistant", "content": "It is"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
    ],
    ids=["plain", "tools", "no-generation-prompt", "template-kwargs", "documents", "continue-final-message"],
)
def test_tokenize_counts_the_prompt_a_chat_request_is_billed(live, fields):
    """vLLM's /tokenize takes the chat template controls; a client sizing a request with it must get
    the prompt_tokens the same chat request is billed."""
    _, key = new_tenant(live.url, "count")
    body = {"model": live.ctx.engine.model_name, "messages": MESSAGES, **fields}
    auth = {"Authorization": f"Bearer {key}"}
    counted = httpx.post(live.url + "/tokenize", headers=auth, json=body, timeout=60)
    assert counted.status_code == 200, counted.text
    billed = httpx.post(live.url + "/v1/chat/completions", headers=auth, json={**body, "max_tokens": 1}, timeout=120)
    assert billed.status_code == 200, billed.text
    assert counted.json()["count"] == billed.json()["usage"]["prompt_tokens"]


def test_tokenize_refuses_what_chat_refuses_in_template_controls(live):
    _, key = new_tenant(live.url, "refuse")
    auth = {"Authorization": f"Bearer {key}"}
    model = live.ctx.engine.model_name
    for fields, param in [
        ({"continue_final_message": True, "add_generation_prompt": False}, "continue_final_message"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),  # per-request templates are off by default
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ]:
        r = httpx.post(
            live.url + "/tokenize", headers=auth, json={"model": model, "messages": MESSAGES, **fields}, timeout=60
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_every_token_id_field_has_the_tokenizers_vocabulary(live):
    """The demo model's embedding has padding rows past the tokenizer (704 vs 663): logit_bias and
    prompt token ids were checked against the embedding, so a bias of +100 on a padding id made the
    whole answer empty text (billed), while allowed_token_ids, stop_token_ids and /detokenize
    refused the same id."""
    _, key = new_tenant(live.url, "vocab")
    auth = {"Authorization": f"Bearer {key}"}
    model = live.ctx.engine.model_name
    vocab = len(live.ctx.engine.tokenizer)
    pad = vocab  # the first id past the tokenizer: a padding row of the demo model's embedding
    chat = {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    for path, body, param in [
        ("/v1/chat/completions", {**chat, "logit_bias": {str(pad): 100}}, "logit_bias"),
        ("/v1/chat/completions", {**chat, "logit_bias": {str(pad): 100}, "stream": True}, "logit_bias"),
        ("/v1/completions", {"model": model, "prompt": [5, pad], "max_tokens": 2}, "prompt"),
        ("/v1/completions", {"model": model, "prompt": [[5], [pad]], "max_tokens": 2}, "prompt"),
        ("/v1/chat/completions", {**chat, "allowed_token_ids": [pad]}, "allowed_token_ids"),
        ("/detokenize", {"model": model, "tokens": [pad]}, "tokens"),
    ]:
        r = httpx.post(live.url + path, headers=auth, json=body, timeout=60)
        assert r.status_code == 400, (path, body, r.text)
        assert r.json()["error"]["param"] == param
    ok = httpx.post(live.url + "/v1/chat/completions", headers=auth, json={**chat, "logit_bias": {str(vocab - 1): 5}})
    assert ok.status_code == 200, ok.text
