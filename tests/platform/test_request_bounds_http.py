"""Through a real server and the official client: a body over a per-request bound of engine-thread
work (stop strings, logit_bias entries, grammar size; engine/config.py ``RequestLimits``) is a 400
with OpenAI's error body naming the parameter; a body at the bound is served (issue 32 item 3)."""

from __future__ import annotations

import openai
import pytest

from loraplex.engine.config import RequestLimits

pytestmark = pytest.mark.timeout(600)

LIMITS = RequestLimits()
MSGS = [{"role": "user", "content": "Hi"}]


def _refused(call, param: str) -> str:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    body = err.value.body
    assert isinstance(body, dict), body
    assert body.get("param") == param and body.get("type") == "invalid_request_error", body
    return str(body.get("message"))


@pytest.mark.parametrize(
    "stop",
    [
        [f"s{i}" for i in range(LIMITS.max_stop_strings + 1)],  # one string too many
        ["x" * (LIMITS.max_stop_chars // 2 + 1)] * 2,  # two strings, too many characters in all
    ],
    ids=["count", "chars"],
)
def test_too_many_stop_strings_are_a_400_naming_stop(module_tenant_setup, stop):
    *_, client = module_tenant_setup
    msg = _refused(lambda: client.completions.create(model="bot", prompt="Hi", max_tokens=2, stop=stop), "stop")
    assert "at most" in msg
    _refused(lambda: client.chat.completions.create(model="bot", messages=MSGS, max_tokens=2, stop=stop), "stop")


def test_stop_strings_at_the_limit_are_served_with_n(module_tenant_setup):
    *_, client = module_tenant_setup
    stop = [f"{i:02d}" + "q" * (LIMITS.max_stop_chars // LIMITS.max_stop_strings - 2) for i in range(16)]
    assert len(stop) == LIMITS.max_stop_strings and sum(map(len, stop)) == LIMITS.max_stop_chars
    out = client.completions.create(model="bot", prompt="Hi", max_tokens=4, stop=stop, n=4, temperature=1.0, seed=1)
    assert len(out.choices) == 4


def test_too_many_logit_bias_entries_are_a_400_naming_logit_bias(module_tenant_setup):
    *_, client = module_tenant_setup
    over = {str(t): -1.0 for t in range(LIMITS.max_logit_bias + 1)}
    _refused(lambda: client.completions.create(model="bot", prompt="Hi", max_tokens=2, logit_bias=over), "logit_bias")
    at = {str(t): -1.0 for t in range(LIMITS.max_logit_bias)}
    out = client.chat.completions.create(model="bot", messages=MSGS, max_tokens=2, logit_bias=at)
    assert out.choices[0].finish_reason in ("length", "stop")


def test_a_schema_over_the_size_limit_is_a_400_naming_response_format(module_tenant_setup):
    *_, client = module_tenant_setup
    props = {f"p{i:06d}": {"type": "integer"} for i in range(LIMITS.max_structured_spec_bytes // 20)}
    schema = {"type": "object", "properties": props}
    msg = _refused(
        lambda: client.chat.completions.create(
            model="bot",
            messages=MSGS,
            max_tokens=2,
            response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": schema}},
        ),
        "response_format",
    )
    assert "limit" in msg


@pytest.mark.parametrize(
    "words",
    [
        [f"w{i}" for i in range(LIMITS.max_bad_words + 1)],  # one word too many
        ["x" * (LIMITS.max_bad_words_chars // 2 + 1)] * 2,  # two words, too many characters in all
    ],
    ids=["count", "chars"],
)
def test_too_many_bad_words_are_a_400_naming_bad_words(module_tenant_setup, words):
    *_, client = module_tenant_setup
    extra = {"bad_words": words}
    msg = _refused(
        lambda: client.completions.create(model="bot", prompt="Hi", max_tokens=2, extra_body=extra), "bad_words"
    )
    assert "at most" in msg
    _refused(
        lambda: client.chat.completions.create(model="bot", messages=MSGS, max_tokens=2, n=2, extra_body=extra),
        "bad_words",
    )


def test_bad_words_at_the_limit_are_served_with_n(module_tenant_setup):
    *_, client = module_tenant_setup
    per = LIMITS.max_bad_words_chars // LIMITS.max_bad_words
    words = [f"{i:03d}" + "z" * (per - 3) for i in range(LIMITS.max_bad_words)]
    assert sum(map(len, words)) == LIMITS.max_bad_words_chars
    out = client.completions.create(
        model="bot", prompt="Hi", max_tokens=4, n=4, temperature=1.0, seed=1, extra_body={"bad_words": words}
    )
    assert len(out.choices) == 4
