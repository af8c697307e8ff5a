"""Function names are held to OpenAI's ``^[a-zA-Z0-9_-]{1,64}$`` (issue 37 gap): a name with
grammar or template metacharacters is a 400 naming the param, through the official client, on
/v1/chat/completions and /v1/responses; names OpenAI accepts still work."""

from __future__ import annotations

import openai
import pytest

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
BAD = ["", "n" * 65, "a.b", "</tool_call>", 'x"}, {"name": "y', "a\x00b", "a b", "é", "ab\n", "a.*|(b)"]
GOOD = ["get_weather", "a-b_C9", "n" * 64, "9"]


def fn(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize("name", BAD, ids=repr)
def test_bad_tool_name_is_400_naming_the_param(module_tenant_setup, name):
    client = module_tenant_setup[5]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="bot", messages=USER, max_tokens=2, tools=[fn("ok"), fn(name)])
    err = info.value.body
    assert err["param"] == "tools[1].function.name", err
    if len(name) > 64:  # OpenAI's own code for this one
        assert err["code"] == "string_above_max_length", err
    elif name:
        assert err["code"] == "invalid_value" and "^[a-zA-Z0-9_-]+$" in err["message"], err

    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="bot", input="hi", max_output_tokens=16, tools=[{"type": "function", "name": name, "parameters": {}}]
        )
    assert info.value.body["param"] == "tools[0].name", info.value.body


def test_bad_tool_choice_name_is_400(module_tenant_setup):
    client = module_tenant_setup[5]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="bot",
            messages=USER,
            max_tokens=2,
            tools=[fn("ok")],
            tool_choice={"type": "function", "function": {"name": "o k"}},
        )
    assert info.value.body["param"] == "tool_choice.function", info.value.body


def test_good_tool_names_are_served(module_tenant_setup):
    client = module_tenant_setup[5]
    out = client.chat.completions.create(
        model="bot", messages=USER, max_tokens=2, tools=[fn(n) for n in GOOD], tool_choice="none"
    )
    assert out.choices[0].finish_reason in ("length", "stop")
    resp = client.responses.create(
        model="bot",
        input="hi",
        max_output_tokens=16,
        tools=[{"type": "function", "name": n, "parameters": {"type": "object"}} for n in GOOD],
        tool_choice="none",
    )
    assert resp.status in ("completed", "incomplete")
