"""Errors the frameworks recognise, through the frameworks themselves (issue 36): a request that
cannot fit the context is OpenAI's ``context_length_exceeded`` (LiteLLM raises its
``ContextWindowExceededError``, LangChain its ``ContextOverflowError``, so their fallbacks fire),
every validation error has OpenAI's code and param spelling, and bodies and chunks carry
``system_fingerprint``. Oracles: the HF tokenizer's own count of the prompt, OpenAI's documented
codes (docs/openai-api.md), and the frameworks' exception classes."""

from __future__ import annotations

import json
import os
import re

import httpx
import openai
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM reads no price list from the network
import litellm  # noqa: E402
from langchain_core.exceptions import ContextOverflowError  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

pytestmark = pytest.mark.timeout(600)
litellm.telemetry = False


def _template_tokens(ctx, messages: list[dict]) -> int:
    ids = ctx.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _long_messages(ctx) -> tuple[list[dict], int]:
    """A chat that cannot fit the context by tokens (but passes the character bound), and its
    prompt's token count as the tokenizer's own chat template makes it."""
    context = ctx.engine.max_model_len
    text = " ".join(f"w{i}" for i in range(context))
    messages = [{"role": "user", "content": text}]
    assert len(text) < ctx.engine.max_prompt_chars()  # refused by tokens, not by characters
    count = _template_tokens(ctx, messages)
    assert count > context
    return messages, count


def _openai_context_error(err: dict, context: int, param: str) -> None:
    assert err["code"] == "context_length_exceeded" and err["param"] == param, err
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith(f"This model's maximum context length is {context} tokens. However, "), err


def test_context_overflow_has_openais_code_param_and_wording(module_tenant_setup):
    ctx, url, _tid, _key, _ada, client = module_tenant_setup
    base, context = ctx.engine.model_name, ctx.engine.max_model_len
    messages, prompt_tokens = _long_messages(ctx)
    # chat, plain / streamed / n > 1: refused before any byte, the prompt's real token count stated
    for extra in ({}, {"stream": True}, {"n": 3}, {"max_tokens": 5}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=base, messages=messages, **extra)
        _openai_context_error(e.value.body, context, "messages")
        assert f"your messages resulted in {prompt_tokens} tokens" in e.value.body["message"], extra
    # a short prompt with a completion that cannot fit beside it: OpenAI's "you requested" form
    short = [{"role": "user", "content": "hi"}]
    n_short = _template_tokens(ctx, short)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=base, messages=short, max_tokens=context)
    _openai_context_error(e.value.body, context, "messages")
    assert (
        f"you requested {n_short + context} tokens ({n_short} in the messages, {context} in the completion)"
        in e.value.body["message"]
    )
    # exactly what is left fits (the boundary is prompt + max_tokens <= context): accepted, which a
    # stream shows at its first chunk (a refusal comes before any byte); leaving it then ends the
    # generation instead of decoding the whole context
    with client.chat.completions.create(
        model=base, messages=short, max_tokens=context - n_short, stream=True
    ) as accepted:
        first = next(iter(accepted))
    assert first.choices and first.choices[0].index == 0
    # completions: the prompt; the Responses API: the input
    prompt = messages[0]["content"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=base, prompt=prompt, max_tokens=1)
    _openai_context_error(e.value.body, context, "prompt")
    assert f"your prompt resulted in {len(ctx.engine.tokenizer.encode(prompt))} tokens" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=base, input=prompt)
    _openai_context_error(e.value.body, context, "input")
    # beyond any context by characters alone (refused without tokenizing): the same error
    huge = "z" * (ctx.engine.max_prompt_chars() + 1)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=base, messages=[{"role": "user", "content": huge}])
    _openai_context_error(e.value.body, context, "messages")


def test_litellm_raises_context_window_exceeded_and_nothing_else_does(module_tenant_setup):
    ctx, url, _tid, key, _ada, _client = module_tenant_setup
    base, context = ctx.engine.model_name, ctx.engine.max_model_len
    messages, _ = _long_messages(ctx)
    common = dict(model=f"openai/{base}", api_base=url + "/v1", api_key=key, num_retries=0, timeout=120)
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=messages, **common)
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=messages, stream=True, **common)
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(messages=[{"role": "user", "content": "hi"}], max_tokens=context, **common)
    # a bad value, or a name too long, is an ordinary bad request: no context fallback must fire
    for bad in ({"temperature": 5}, {"tools": [{"type": "function", "function": {"name": "f" * 65}}]}):
        with pytest.raises(litellm.BadRequestError) as e:
            litellm.completion(messages=[{"role": "user", "content": "hi"}], max_tokens=2, **bad, **common)
        assert not isinstance(e.value, litellm.ContextWindowExceededError), bad
    ok = litellm.completion(messages=[{"role": "user", "content": "hi"}], max_tokens=2, **common)
    assert ok.choices[0].message is not None


def test_langchain_raises_context_overflow(module_tenant_setup):
    ctx, url, _tid, key, _ada, _client = module_tenant_setup
    messages, _ = _long_messages(ctx)
    llm = ChatOpenAI(base_url=url + "/v1", api_key=key, model=ctx.engine.model_name, max_retries=0, timeout=120)
    with pytest.raises(ContextOverflowError):
        llm.invoke(messages[0]["content"])
    with pytest.raises(openai.BadRequestError) as e:  # an ordinary bad value is no overflow
        llm.bind(temperature=5).invoke("hi")
    assert not isinstance(e.value, ContextOverflowError)


# (body change, expected param, expected code): OpenAI's codes for the same mistakes
CHAT_MISTAKES = [
    ({"messages": None}, "messages", "missing_required_parameter"),
    ({"model": None}, "model", "missing_required_parameter"),
    ({"max_tokens": "ten"}, "max_tokens", "invalid_type"),
    ({"max_tokens": 1.5}, "max_tokens", "invalid_type"),
    ({"messages": "hi"}, "messages", "invalid_type"),
    ({"model": 5}, "model", "invalid_type"),
    ({"stop": 5}, "stop", "invalid_type"),
    ({"stop": 5, "stop_token_ids": "x"}, "stop", "invalid_type"),  # two problems: the first named, not merged
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages[0].content[0].text",
        "invalid_type",
    ),
    ({"temperature": 5}, "temperature", "decimal_above_max_value"),
    ({"temperature": -0.5}, "temperature", "decimal_below_min_value"),
    ({"n": 0}, "n", "integer_below_min_value"),
    ({"n": 17}, "n", "integer_above_max_value"),
    ({"seed": 2**64}, "seed", "integer_above_max_value"),
    ({"messages": []}, "messages", "empty_array"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}] * 129}, "tools", "array_above_max_length"),
    (
        {"tools": [{"type": "function", "function": {"name": "f" * 65}}]},
        "tools[0].function.name",
        "string_above_max_length",
    ),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
    ({"priority": 3}, "priority", "unsupported_parameter"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "invalid_value"),
]


@pytest.mark.parametrize(("change", "param", "code"), CHAT_MISTAKES)
def test_every_validation_error_has_openais_code_and_param(module_tenant_setup, change, param, code):
    ctx, url, _tid, key, _ada, client = module_tenant_setup
    body = {"model": ctx.engine.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error"), err
    assert set(err) == {"message", "type", "param", "code"}
    if code not in ("invalid_value", "unsupported_parameter"):  # OpenAI's sentences name the field
        assert f"'{param}'" in err["message"], err
    if "model" in body and "messages" in body:  # the official SDK raises BadRequestError with them
        known = {"model", "messages", "max_tokens", "temperature", "n", "seed", "stop", "tools", "tool_choice"}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                **{k: v for k, v in body.items() if k in known},
                extra_body={k: v for k, v in body.items() if k not in known},
            )
        assert (e.value.code, e.value.param) == (code, param)


def test_hostile_values_in_errors_are_not_echoed_whole(module_tenant_setup):
    """A 10 MB-ish wrong-typed value, a huge number, deep nesting: the error names the field and
    the kind, never the value itself (an error body is no amplifier)."""
    ctx, url, _tid, key, _ada, _client = module_tenant_setup
    base = ctx.engine.model_name
    headers = {"authorization": f"Bearer {key}"}
    cases = [
        {"model": base, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "9" * 200_000},
        {"model": base, "messages": [{"role": "user", "content": "hi"}], "n": 10**300},
        {"model": base, "messages": [{"role": "user", "content": "hi"}], "stop": {"a": ["b"] * 50_000}},
        {"model": base, "messages": [{"role": "x" * 100_000, "content": "hi"}]},
    ]
    for body in cases:
        r = httpx.post(url + "/v1/chat/completions", headers=headers, content=json.dumps(body), timeout=60)
        assert r.status_code == 400, r.text[:300]
        assert len(r.content) < 2_000, r.text[:300]


def test_system_fingerprint_on_bodies_and_chunks(module_tenant_setup):
    ctx, _url, _tid, _key, _ada, client = module_tenant_setup
    base = ctx.engine.model_name
    msgs = [{"role": "user", "content": "hi"}]
    fp = client.chat.completions.create(model=base, messages=msgs, max_tokens=2).system_fingerprint
    assert fp is not None and re.fullmatch(r"fp_[0-9a-f]{10}", fp)
    # the same backend, the same fingerprint: another request, the completions endpoint, each chunk
    assert client.chat.completions.create(model=base, messages=msgs, max_tokens=1, n=2).system_fingerprint == fp
    assert client.completions.create(model=base, prompt="hi", max_tokens=2).system_fingerprint == fp
    chunks = list(
        client.chat.completions.create(
            model=base, messages=msgs, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    )
    assert len(chunks) >= 2 and {c.system_fingerprint for c in chunks} == {fp}
    chunks = list(client.completions.create(model=base, prompt="hi", max_tokens=3, stream=True))
    assert {c.system_fingerprint for c in chunks} == {fp}
    # an adapter's weights answer: another fingerprint (the same for each of its requests)
    bot = client.chat.completions.create(model="bot", messages=msgs, max_tokens=2).system_fingerprint
    assert bot is not None and bot != fp
    assert client.completions.create(model="bot", prompt="hi", max_tokens=2).system_fingerprint == bot


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("body", "messages", 0, "content", "list[TextPart]", 0, "text"), "messages[0].content[0].text"),
        (("body", "tool_choice", "literal['none','auto','required']"), "tool_choice"),
        (("body", "tool_choice", "NamedToolChoice", "function"), "tool_choice.function"),
        (("body", "stop", "str"), "stop"),
        (("body",), None),
        (("query", "limit"), "limit"),
    ],
)
def test_openai_param_spelling(loc, param):
    from loraplex.platform.http.error_handlers import openai_param

    assert openai_param(loc) == param
