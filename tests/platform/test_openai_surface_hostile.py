"""The request path (to_sampling_params -> admission -> start_all -> render) attacked through a real
server: n > 1 streams with tools, structured output with logprobs, stop strings that span tokens,
hostile values (lone surrogates, int overflows, negative token ids, huge bodies), echo + logprobs
at a tenant's quota. Every answer is a 200 or a 4xx with OpenAI's error body, never a 500."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from platform_helpers import admin_headers

pytestmark = pytest.mark.timeout(600)

# Tests that only send a hostile body and read the answer share one server per backend
# (module_tenant_setup, CONTRIBUTING.md); tests whose oracle is the server's state (a quota's holds)
# or that stream get their own (tenant_setup).

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
MSGS = [{"role": "user", "content": "Weather in Paris?"}]


def _post(url: str, key: str, path: str, body: dict | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(
        url + path,
        content=content.encode("utf-8", "surrogatepass"),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=120,
    )


def test_n2_streams_of_required_tool_calls_and_of_json_with_logprobs(tenant_setup):
    ctx, *_, client = tenant_setup
    stream = client.chat.completions.create(
        model="bot",
        messages=MSGS,
        tools=TOOLS,
        tool_choice="required",
        n=2,
        temperature=1.0,
        seed=3,
        max_tokens=60,
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict[int, dict]] = {0: {}, 1: {}}
    finish: dict[int, str] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                entry = calls[c.index].setdefault(tc.index, {"name": "", "arguments": ""})
                if tc.function.name:
                    entry["name"] += tc.function.name
                entry["arguments"] += tc.function.arguments or ""
            if c.finish_reason:
                assert c.index not in finish, "a choice ended twice"
                finish[c.index] = c.finish_reason
    assert set(finish) == {0, 1} and usage is not None and usage.completion_tokens >= 2
    for i in (0, 1):
        if finish[i] == "tool_calls":
            assert calls[i] and all(c["name"] == "get_weather" for c in calls[i].values())
            for c in calls[i].values():
                jsonschema.validate(json.loads(c["arguments"]), WEATHER)
        else:
            assert finish[i] == "length"
    # structured output + logprobs, n = 2, streamed: each choice's bytes are its content, valid JSON
    stream = client.chat.completions.create(
        model="bot",
        messages=MSGS,
        n=2,
        seed=5,
        max_tokens=60,
        logprobs=True,
        top_logprobs=2,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        stream=True,
    )
    text = {0: "", 1: ""}
    raw = {0: b"", 1: b""}
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            for t in (c.logprobs.content or []) if c.logprobs else []:
                assert len(t.top_logprobs) == 2
                raw[c.index] += bytes(t.bytes)
    eos = ctx.engine.tokenizer.eos_token
    for i in (0, 1):
        # the ending EOS token is listed in logprobs (its special-token text) but not in content
        assert raw[i].decode("utf-8").removesuffix(eos) == text[i]
        jsonschema.validate(json.loads(text[i]), PERSON)


def test_stop_string_spanning_tokens_streams_nothing_past_it(tenant_setup):
    ctx, *_, client = tenant_setup
    tok = ctx.engine.tokenizer
    kw = dict(model="bot", prompt="The scheduler", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw, logprobs=0).choices[0]
    pieces = full.logprobs.tokens
    # a stop string made of the end of one token and the start of the next (it spans a boundary)
    k = next(i for i in range(2, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 1)
    stop = pieces[k][-2:] + pieces[k + 1][:1]
    cut = full.text.index(stop)
    assert len(tok.encode(stop, add_special_tokens=False)) >= 1
    for include in (False, True):
        extra = {"ignore_eos": True, "include_stop_str_in_output": include}
        want = full.text[: cut + (len(stop) if include else 0)]
        whole = client.completions.create(**{**kw, "extra_body": extra}, stop=[stop]).choices[0]
        assert (whole.text, whole.finish_reason) == (want, "stop")
        chunks = list(client.completions.create(**{**kw, "extra_body": extra}, stop=[stop], n=2, stream=True))
        for i in (0, 1):
            texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i]
            assert "".join(texts) == want  # nothing past the stop was ever sent
    chat_stop = client.chat.completions.create(
        model="bot", messages=MSGS, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
    )
    content = chat_stop.choices[0].message.content or ""
    if len(content) > 4:
        s = content[2:5]
        chunks = list(
            client.chat.completions.create(
                model="bot",
                messages=MSGS,
                max_tokens=24,
                temperature=0,
                stop=s,
                stream=True,
                extra_body={"ignore_eos": True},
            )
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == content[: content.index(s)]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "seed": 2**64}, "seed"),
        ("/v1/completions", {"prompt": "x", "seed": -(2**70)}, "seed"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2**70}, None),
        ("/v1/completions", {"prompt": "x", "n": 2**40}, None),
        ("/v1/completions", {"prompt": "x", "logprobs": 2**63}, None),
        ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 21}, None),
        ("/v1/completions", {"prompt": [5, -1, 7]}, "prompt"),
        ("/v1/completions", {"prompt": [[5, 6], [2**70]]}, "prompt"),
        ("/v1/completions", {"prompt": "x", "stop_token_ids": [2**64]}, None),
        ("/v1/completions", {"prompt": "x", "allowed_token_ids": [2**64]}, None),
        ("/v1/completions", {"prompt": "x", "logit_bias": {str(2**64): 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "x", "logit_bias": {"-5": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "x", "min_tokens": 2**70}, None),
        ("/v1/completions", {"prompt": "x", "prompt_logprobs": 2**70}, None),
        ("/v1/chat/completions", {"messages": MSGS, "top_logprobs": 2**70, "logprobs": True}, None),
        ("/v1/chat/completions", {"messages": MSGS, "max_completion_tokens": -(2**70)}, None),
    ],
)
def test_int_overflows_are_400s(module_tenant_setup, path, body, param):
    """(top_k and truncate_prompt_tokens past any vocabulary or prompt mean "all": 200, below.)"""
    ctx, url, tid, key, ada, client = module_tenant_setup
    r = _post(
        url,
        key,
        path,
        {"model": "bot", "max_tokens": 2, **body} if "max_tokens" not in body else body | {"model": "bot"},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


def test_huge_but_meaningful_ints_are_served(module_tenant_setup):
    ctx, url, tid, key, ada, client = module_tenant_setup
    for extra in ({"top_k": 2**70}, {"truncate_prompt_tokens": 2**70}):
        r = _post(url, key, "/v1/completions", {"model": "bot", "prompt": "x", "max_tokens": 2, **extra})
        assert r.status_code == 200, (extra, r.text)


@pytest.mark.parametrize(
    "field",
    [
        {"stop": "ab\ud800"},
        {"stop": ["\udfff"]},
        {"bad_words": ["x\ud800"]},
        {"user": "\ud800"},
        {"logit_bias": {"\ud800": 1}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "\ud800", "schema": PERSON}}},
        {"guided_regex": "a\ud800"},
        {"guided_choice": ["a", "\ud800"]},
        {"structured_outputs": {"choice": ["\udc00"]}},
        {"prompt": "x\ud800", "echo": True, "logprobs": 1},
    ],
)
def test_lone_surrogates_anywhere_are_4xx_never_500(module_tenant_setup, field):
    ctx, url, tid, key, ada, client = module_tenant_setup
    path = "/v1/completions"
    body = {"model": "bot", "prompt": "hi", "max_tokens": 2, **field}
    raw = json.dumps(body)  # json escapes the lone surrogate as \\udXXX: valid JSON text, invalid Unicode
    r = _post(url, key, path, raw)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"]["type"] == "invalid_request_error"
    else:  # accepted: the answer is valid UTF-8 JSON
        json.loads(r.content.decode("utf-8"))
    stream = _post(url, key, path, json.dumps({**body, "stream": True, "logprobs": None, "echo": False}))
    assert stream.status_code < 500, stream.text


def test_echo_logprobs_n_and_prompt_lists_at_a_tenant_quota(tenant_setup):
    """A prompt list with n > 1 and echo + logprobs reserves prompt + n x max_tokens per prompt:
    at a tpm that holds one prompt but not two, the request is a 429 and nothing stays reserved."""
    ctx, url, tid, key, ada, client = tenant_setup
    kw = dict(model="bot", max_tokens=8, n=2, echo=True, logprobs=1, extra_body={"ignore_eos": True})
    one = client.completions.create(**kw, prompt="Hello there")
    assert one.usage.completion_tokens == 16
    per_prompt = one.usage.prompt_tokens + 16
    headers = admin_headers()
    httpx.put(url + f"/admin/v1/tenants/{tid}/quota", json={"tpm": per_prompt * 3}, headers=headers).raise_for_status()
    with pytest.raises(openai.RateLimitError):
        client.completions.create(**kw, prompt=["Hello there"] * 3)
    assert ctx.inflight.count() == 0 if hasattr(ctx.inflight, "count") else True
    ok = client.completions.create(**kw, prompt=["Hello there"])  # the refused one gave its hold back
    assert ok.choices[0].text.startswith("Hello there") and ok.choices[0].logprobs.token_logprobs[0] is None


def test_huge_bodies_are_refused_before_work(tenant_setup):
    ctx, url, tid, key, ada, client = tenant_setup
    r = _post(url, key, "/v1/completions", {"model": "bot", "prompt": "x" * (40 * 1024 * 1024), "max_tokens": 1})
    assert r.status_code in (400, 413), r.status_code
    many = {"model": "bot", "prompt": ["a"] * 65, "max_tokens": 1, "echo": True, "logprobs": 1}
    r = _post(url, key, "/v1/completions", many)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    stops = {"model": "bot", "prompt": "a", "max_tokens": 1, "stop": ["z" * 100_000] * 4}
    r = _post(url, key, "/v1/completions", stops)
    assert r.status_code < 500
