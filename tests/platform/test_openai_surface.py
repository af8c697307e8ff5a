# ruff: noqa: F811  (the server/tenant_setup fixtures are imported by name from test_openai_api)
"""The OpenAI surface agent frameworks use, through the official `openai` client: structured output,
tools, n, logprobs, penalties, logit_bias, prompt lists, content parts, roles, unsupported
parameters, /tokenize. The model is random: JSON validity is the grammar's doing.

Every test runs twice: against one process (a real uvicorn) and against ``loraplex serve
--replicas 2`` on Ray with the DEFAULT configuration (no engine settings but the model), so the
scale-out serves the very same surface."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import jsonschema
import openai
import pytest
import torch
from billing_helpers import H
from harness.ray import ServeCluster
from platform_helpers import ADMIN_KEY, zip_bytes

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "pet": {"enum": ["cat", "dog"]},
        "alive": {"type": "boolean"},
    },
    "required": ["name", "age", "pet", "alive"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"tz": {"enum": ["UTC", "CET"]}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
MSGS = [
    {"role": "developer", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
]


@dataclass
class _ClusterEngine:
    """What these tests read from ``ctx.engine``, for a server in other processes."""

    model_name: str
    tokenizer: object
    logprob_tol: float


@dataclass
class _ClusterCtx:
    engine: _ClusterEngine


@pytest.fixture(scope="module")
def default_cluster(demo_model_dir, tmp_path_factory):
    """``loraplex serve --replicas 2``, no config file: the default [engine] and [cluster]."""
    pytest.importorskip("ray.serve", reason="the --replicas 2 surface needs loraplex[ray]")
    c = ServeCluster(tmp_path_factory.mktemp("surface-cluster"), demo_model_dir, None, admin_key=ADMIN_KEY)
    yield c
    c.stop()


def _cluster_setup(cluster, good_files, demo_model_dir):
    if getattr(cluster, "setup", None) is None:  # one tenant and adapter for the module
        from loraplex.engine.config import resolve_dtype
        from loraplex.engine.models import ModelConfig
        from loraplex.engine.tokenizer import load_tokenizer

        with httpx.Client(base_url=cluster.url, headers=H, timeout=60) as c:
            tid = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
            key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
            ada = c.post(
                "/admin/v1/adapters",
                data={"name": "bot", "tenant_id": tid},
                files={"file": ("bot.zip", zip_bytes(good_files))},
            ).json()
        # The default dtype (auto) may be bf16 on this CPU: the HF fp32 oracle then agrees less closely.
        dtype = resolve_dtype("auto", torch.device("cpu"), ModelConfig.from_dir(str(demo_model_dir)).checkpoint_dtype)
        gw = _ClusterEngine(
            demo_model_dir.name, load_tokenizer(demo_model_dir), 1e-3 if dtype == torch.float32 else 5e-2
        )
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key=key, max_retries=0, timeout=120)
        cluster.setup = (_ClusterCtx(gw), cluster.url, tid, key, ada, client)
    return cluster.setup


@pytest.fixture(params=["one-process", pytest.param("replicas-2", marks=pytest.mark.slow)])
def surface(request, db_url):
    """(ctx, url, tenant id, key, adapter, openai client) of the server under test."""
    if request.param == "one-process":
        return request.getfixturevalue("tenant_setup")
    if not db_url.startswith("sqlite"):
        pytest.skip("the --replicas 2 variant runs once (its own SQLite database)")
    cluster = request.getfixturevalue("default_cluster")
    return _cluster_setup(cluster, request.getfixturevalue("good_files"), request.getfixturevalue("demo_model_dir"))


def test_json_schema_and_json_object_outputs_validate(surface):
    *_, client = surface
    r = client.chat.completions.create(
        model="bot",
        messages=MSGS,
        max_tokens=80,
        temperature=1.0,
        seed=3,
        n=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    assert len(r.choices) == 3 and [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), PERSON)
    assert r.usage.completion_tokens >= 3 * 10  # every choice's tokens are counted
    base = surface[0].engine.model_name
    obj = client.completions.create(
        model=base,
        prompt="Data:",
        max_tokens=60,
        temperature=0.9,
        seed=1,
        extra_body={"response_format": {"type": "json_object"}},
    )
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].text), dict)
    else:
        assert obj.choices[0].text.startswith("{")


def test_unsupported_schema_is_a_400_naming_the_construct(surface):
    *_, client = surface
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="bot",
            messages=MSGS,
            max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}},
        )
    assert 'Unsupported type "foo"' in e.value.body["message"] and e.value.body["param"] == "response_format"


def test_named_and_required_tool_calls(surface):
    *_, client = surface
    named = client.chat.completions.create(
        model="bot",
        messages=MSGS,
        tools=TOOLS,
        max_tokens=60,
        temperature=1.0,
        seed=2,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    c = named.choices[0]
    assert c.finish_reason == "stop" and c.message.content is None  # OpenAI: a named tool_choice stops
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)

    req = client.chat.completions.create(
        model="bot",
        messages=MSGS,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=200,  # the call in the model's own (Hermes) form
        temperature=1.0,
        seed=4,
        parallel_tool_calls=False,  # exactly one call: a random model seldom picks its stop token
    )
    call = req.choices[0].message.tool_calls[0]
    assert req.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(
        json.loads(call.function.arguments), {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    )

    # Streaming: tool-call deltas that assemble to the same call as the non-streamed answer.
    chunks = list(
        client.chat.completions.create(
            model="bot",
            messages=MSGS,
            tools=TOOLS,
            max_tokens=60,
            temperature=1.0,
            seed=2,
            stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
    )
    deltas = [tc for ch in chunks for ch_c in ch.choices for tc in (ch_c.delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    assert (
        "".join(d.function.arguments or "" for d in deltas) == named.choices[0].message.tool_calls[0].function.arguments
    )
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"

    # The conversation continues with the assistant's tool call and the tool's answer.
    follow = client.chat.completions.create(
        model="bot",
        max_tokens=5,
        temperature=0,
        tools=TOOLS,
        messages=MSGS
        + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ],
    )
    assert follow.choices[0].message.role == "assistant"


def test_logit_bias_forces_a_token(surface):
    ctx, *_, client = surface
    tok = ctx.engine.tokenizer
    forced = tok.encode("fox")[0]
    r = client.completions.create(
        model="bot",
        prompt="Hello",
        max_tokens=5,
        temperature=1.0,
        seed=0,
        logit_bias={str(forced): 100},
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].text == tok.decode([forced] * 5)
    banned = client.completions.create(
        model="bot", prompt="Hello", max_tokens=5, temperature=0, logprobs=0, logit_bias={str(forced): -100}
    )
    assert tok.decode([forced]) not in banned.choices[0].logprobs.tokens


def test_n_times_logprobs_shapes_and_values(surface, demo_model_dir):
    ctx, *_, client = surface
    base = ctx.engine.model_name
    prompt = [5, 17, 42, 8]
    r = client.completions.create(
        model=base,
        prompt=prompt,
        max_tokens=4,
        temperature=0.8,
        seed=9,
        n=3,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
        assert all(len(t) == 2 for t in lp.top_logprobs)
    assert r.usage.completion_tokens == 12
    # Oracle: HF transformers' own log-softmax of the first generated position.
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
    greedy = client.completions.create(model=base, prompt=prompt, max_tokens=1, temperature=0, logprobs=3)
    top = greedy.choices[0].logprobs.top_logprobs[0]
    ref_top = ref.topk(3)
    tok = ctx.engine.tokenizer
    assert list(top) == [tok.decode([i]) for i in ref_top.indices.tolist()]
    tol = getattr(ctx.engine, "logprob_tol", 1e-3)  # the session's one-process engine runs in float32
    assert list(top.values()) == pytest.approx(ref_top.values.tolist(), abs=tol)

    chat = client.chat.completions.create(
        model="bot",
        messages=MSGS,
        max_tokens=3,
        n=2,
        logprobs=True,
        top_logprobs=4,
        temperature=1.0,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    for c in chat.choices:
        assert len(c.logprobs.content) == 3 and all(len(t.top_logprobs) == 4 for t in c.logprobs.content)
        assert bytes(b for t in c.logprobs.content for b in t.bytes).decode("utf-8", "ignore") == c.message.content


def test_prompt_logprobs_of_completions_and_chat(surface, demo_model_dir):
    """vLLM's prompt_logprobs: per choice in completions, once per response in chat; entry p + 1 is
    prompt token p + 1 given the tokens before it (oracle: transformers' log-softmax of the prompt),
    with its rank and the top-k; refused with stream (as vLLM does)."""
    ctx, *_, client = surface
    base = ctx.engine.model_name
    prompts = [[5, 17, 42, 8, 99, 3], [7, 7, 7]]
    r = client.completions.create(
        model=base, prompt=prompts, max_tokens=2, n=2, extra_body={"prompt_logprobs": 2, "ignore_eos": True}
    )
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval()
    tol = getattr(ctx.engine, "logprob_tol", 1e-3)
    for c in r.choices:
        prompt = prompts[c.index // 2]
        got = c.model_extra["prompt_logprobs"]
        assert got[0] is None and len(got) == len(prompt)
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, :-1], -1)
        for p, entry in enumerate(got[1:]):
            token = prompt[p + 1]
            top = ref[p].topk(2)
            if tol <= 1e-3:  # a bf16 engine (the cluster's default) may order near-ties differently
                assert set(entry) == {str(token)} | {str(i) for i in top.indices.tolist()}
            assert str(token) in entry and len(entry) in (2, 3)
            assert entry[str(token)]["logprob"] == pytest.approx(ref[p, token].item(), abs=tol)
            x = ref[p, token]  # its rank: 1 + how many are more likely (near-ties within the tolerance)
            assert int((ref[p] > x + tol).sum()) + 1 <= entry[str(token)]["rank"] <= int((ref[p] > x - tol).sum()) + 1
            assert entry[str(token)]["decoded_token"] == ctx.engine.tokenizer.decode([token])
    chat = client.chat.completions.create(model="bot", messages=MSGS, max_tokens=2, extra_body={"prompt_logprobs": 0})
    got = chat.model_extra["prompt_logprobs"]
    assert got[0] is None and len(got) == chat.usage.prompt_tokens
    assert all(len(e) == 1 and next(iter(e.values()))["rank"] >= 1 for e in got[1:])
    plain = client.chat.completions.create(model="bot", messages=MSGS, max_tokens=2)
    assert "prompt_logprobs" not in (plain.model_extra or {})
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="bot", messages=MSGS, max_tokens=2, stream=True, extra_body={"prompt_logprobs": 1}
        )
    assert err.value.body["param"] == "prompt_logprobs"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=base, prompt="x", max_tokens=1, extra_body={"prompt_logprobs": 21})


def test_echo_with_logprobs_lists_the_prompt_then_the_completion(surface, demo_model_dir):
    """echo + logprobs (OpenAI, vLLM): the prompt's tokens with their logprobs first (the first one
    null: nothing predicts it), then the completion's. Oracle: transformers' log-softmax of the
    prompt (its top 2 too), for a token-id and a text prompt in one list, n > 1 (each choice carries
    its prompt's tokens), prompt_logprobs asked beside it at another k; the completion's part is
    the same request's without echo."""
    ctx, *_, client = surface
    base = ctx.engine.model_name
    tok = ctx.engine.tokenizer
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(demo_model_dir), dtype=torch.float32).eval()
    tol = getattr(ctx.engine, "logprob_tol", 1e-3)
    prompts: list = [[5, 17, 42, 8, 99], tok.encode("The quick brown fox")]  # a list of token-id prompts
    kw = dict(model=base, prompt=prompts, max_tokens=3, n=2, temperature=0, logprobs=2)
    r = client.completions.create(**kw, echo=True, extra_body={"ignore_eos": True, "prompt_logprobs": 1})
    alone = client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c, without in zip(r.choices, alone.choices):
        prompt = prompts[c.index // 2]
        ids = prompt if isinstance(prompt, list) else tok.encode(prompt)
        echo = prompt if isinstance(prompt, str) else tok.decode(prompt)
        assert c.text == echo + without.text
        lp = c.logprobs
        n = len(ids)
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n + 3
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.tokens[:n] == [tok.decode([t]) for t in ids]
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1], -1)
        for p in range(1, n):
            assert lp.token_logprobs[p] == pytest.approx(ref[p - 1, ids[p]].item(), abs=tol), p
            top = ref[p - 1].topk(2)
            if tol <= 1e-3:  # a bf16 engine (the cluster's default) may order near-ties differently
                assert list(lp.top_logprobs[p]) == [tok.decode([i]) for i in top.indices.tolist()]
            assert sorted(lp.top_logprobs[p].values(), reverse=True) == pytest.approx(top.values.tolist(), abs=tol)
        assert lp.text_offset[:n] == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
        # the completion's part: what the request without echo answers, offsets after the echo
        w = without.logprobs
        assert lp.tokens[n:] == w.tokens and lp.token_logprobs[n:] == pytest.approx(w.token_logprobs, abs=tol)
        assert lp.text_offset[n:] == [len(echo) + o for o in w.text_offset]
        # prompt_logprobs asked beside it: vLLM's layout at its own k (the prompt token + its top 1)
        plps = c.model_extra["prompt_logprobs"]
        assert plps[0] is None and len(plps) == n and all(1 <= len(e) <= 2 for e in plps[1:])
    text = "The quick brown fox"  # a text prompt: its tokens as the server tokenizes it
    plain = client.completions.create(model=base, prompt=text, max_tokens=2, echo=True, logprobs=0)
    assert "prompt_logprobs" not in (plain.choices[0].model_extra or {})
    assert plain.choices[0].text.startswith(text) and plain.choices[0].logprobs.top_logprobs[1] == {}
    assert plain.choices[0].logprobs.tokens[: len(prompts[1])] == [tok.decode([t]) for t in prompts[1]]


def test_penalties_change_a_greedy_output(surface):
    *_, client = surface
    kw = dict(model="bot", prompt="The quick brown", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(**kw, logprobs=0).choices[0]
    pen = client.completions.create(
        **{**kw, "extra_body": {"ignore_eos": True, "repetition_penalty": 1.5}},
        frequency_penalty=1.5,
        presence_penalty=1.0,
        logprobs=0,
    ).choices[0]
    assert pen.text != plain.text
    assert len(set(pen.logprobs.tokens)) > len(set(plain.logprobs.tokens))


def test_prompt_lists_n_streaming_usage_and_echo(surface):
    *_, client = surface
    r = client.completions.create(
        model="bot",
        prompt=["abc", "Hello, world"],
        n=2,
        max_tokens=3,
        temperature=0.7,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and r.usage.completion_tokens == 12
    single = client.completions.create(model="bot", prompt="abc", max_tokens=3, extra_body={"ignore_eos": True})
    both = client.completions.create(
        model="bot", prompt="abc", max_tokens=3, extra_body={"ignore_eos": True}, echo=True
    )
    assert both.choices[0].text.startswith("abc")
    assert (
        r.usage.prompt_tokens
        == single.usage.prompt_tokens
        + client.completions.create(model="bot", prompt="Hello, world", max_tokens=1).usage.prompt_tokens
    )
    chunks = list(
        client.chat.completions.create(
            model="bot",
            messages=MSGS,
            n=3,
            max_tokens=4,
            temperature=1.0,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1, 2}
    assert chunks[-1].usage.completion_tokens == 12


def test_unsupported_parameters_are_400_and_unknown_ones_ignored(surface):
    *_, client = surface
    cases = [
        (dict(extra_body={"audio": {"voice": "alloy"}}), "audio"),
        (dict(extra_body={"modalities": ["text", "audio"]}), "modalities"),
        (dict(extra_body={"functions": [{"name": "f"}]}), "functions"),
        (
            dict(
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
            ),
            "messages[0].content[0].type",
        ),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(top_logprobs=2), "top_logprobs"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**{"model": "bot", "messages": MSGS, "max_tokens": 2, **kwargs})
        assert e.value.body["param"] == param, kwargs
    with pytest.raises(openai.BadRequestError) as e:  # the prompt's logprobs come with the answer
        client.completions.create(model="bot", prompt="x", max_tokens=2, echo=True, logprobs=1, stream=True)
    assert e.value.body["param"] == "echo"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="bot", prompt="x", max_tokens=2, logit_bias={"999999": 5})
    assert e.value.body["param"] == "logit_bias"
    ok = client.chat.completions.create(
        model="bot",
        messages=MSGS,
        max_tokens=2,
        store=False,
        metadata={"a": "b"},
        user="u-1",
        extra_body={"some_future_field": 1, "min_p": 0.1, "top_k": 5},
    )
    assert ok.choices[0].message.role == "assistant"


def test_tokenize_and_detokenize(surface):
    ctx, url, tid, key, ada, client = surface
    h = {"Authorization": f"Bearer {key}"}
    tok = ctx.engine.tokenizer
    r = httpx.post(url + "/tokenize", json={"model": "bot", "prompt": "Hello, world"}, headers=h).json()
    assert r["tokens"] == tok.encode("Hello, world") and r["count"] == len(r["tokens"])
    back = httpx.post(url + "/detokenize", json={"model": "bot", "tokens": r["tokens"]}, headers=h).json()
    assert back["prompt"] == "Hello, world"
    chat = httpx.post(
        url + "/tokenize", json={"model": "bot", "messages": [{"role": "user", "content": "Hi"}]}, headers=h
    ).json()
    completion = client.chat.completions.create(model="bot", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    assert chat["count"] == completion.usage.prompt_tokens
    assert httpx.post(url + "/tokenize", json={"model": "nope", "prompt": "x"}, headers=h).status_code == 404
    assert httpx.post(url + "/tokenize", json={"model": "bot", "prompt": "x"}).status_code == 401
