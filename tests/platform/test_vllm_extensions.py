"""vLLM's request extensions through the real server: each is honoured (oracle: what the output
must then look like) or refused with a 400 naming it, never silently ignored. Every test only sends
requests and reads the answers: one server per backend serves the whole module (module_tenant_setup)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

USER = [{"role": "user", "content": "Capital of France?"}]


def _post(setup, path: str, **body) -> httpx.Response:
    _, url, _, key, _, _ = setup
    return httpx.post(
        f"{url}/v1/{path}", headers={"authorization": f"Bearer {key}"}, json={"model": "bot", **body}, timeout=60
    )


def _chat(setup, **body) -> dict:
    r = _post(setup, "chat/completions", messages=USER, **body)
    assert r.status_code == 200, r.text
    return r.json()


def test_structured_outputs_and_guided_choice(module_tenant_setup):
    choices = ["Paris", "Lyon (FR)", "a|b.c*"]
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        for seed in range(3):
            text = _chat(module_tenant_setup, max_tokens=20, seed=seed, **extra)["choices"][0]["message"]["content"]
            assert text in choices
    text = _chat(module_tenant_setup, max_tokens=20, seed=1, structured_outputs={"regex": "[0-9]{3}-[a-z]{2}"})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", text["choices"][0]["message"]["content"])
    schema = {"type": "object", "properties": {"b": {"type": "boolean"}, "a": {"enum": [1, 2]}}, "required": ["b", "a"]}
    obj = _chat(module_tenant_setup, max_tokens=40, seed=2, structured_outputs={"json": schema})["choices"][0]
    assert list(json.loads(obj["message"]["content"])) == ["b", "a"]
    g = _chat(module_tenant_setup, max_tokens=20, seed=3, structured_outputs={"grammar": 'root ::= "yes" | "no"'})
    assert g["choices"][0]["message"]["content"] in ("yes", "no")


def test_stop_string_kept_with_include_stop_str_in_output(module_tenant_setup):
    free = _chat(module_tenant_setup, max_tokens=16, temperature=0, ignore_eos=True)["choices"][0]["message"]["content"]
    stop = free[4:6]
    cut = _chat(module_tenant_setup, max_tokens=16, temperature=0, ignore_eos=True, stop=[stop])
    kept = _chat(
        module_tenant_setup, max_tokens=16, temperature=0, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
    )
    assert cut["choices"][0]["message"]["content"] == free[: free.index(stop)]
    assert kept["choices"][0]["message"]["content"] == free[: free.index(stop) + len(stop)]


def test_min_tokens_bad_words_and_allowed_token_ids(module_tenant_setup):
    ctx = module_tenant_setup[0]
    tok = ctx.engine.tokenizer
    eos = tok.eos_token_id
    early = _chat(module_tenant_setup, max_tokens=10, temperature=0, logit_bias={str(eos): 100})
    assert early["usage"]["completion_tokens"] == 1
    held = _chat(module_tenant_setup, max_tokens=10, temperature=0, logit_bias={str(eos): 100}, min_tokens=5)
    assert held["usage"]["completion_tokens"] == 6
    free = _chat(module_tenant_setup, max_tokens=12, temperature=0, ignore_eos=True)["choices"][0]["message"]["content"]
    word = free.split()[0] if free.split() else free[:3]
    banned = _chat(module_tenant_setup, max_tokens=12, temperature=0, ignore_eos=True, bad_words=[word])
    assert not banned["choices"][0]["message"]["content"].startswith(word)
    allowed = [tok.encode("a")[0], tok.encode("b")[0]]
    only = _chat(module_tenant_setup, max_tokens=8, temperature=1.0, seed=1, ignore_eos=True, allowed_token_ids=allowed)
    assert set(only["choices"][0]["message"]["content"]) <= {"a", "b"}


@pytest.mark.parametrize(
    "body,param",
    [
        ({"priority": 3}, "priority"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"allowed_token_ids": [10**7]}, "allowed_token_ids"),
        ({"stop_token_ids": [10**7]}, "stop_token_ids"),
        ({"min_tokens": 50, "max_tokens": 5}, "min_tokens"),
        ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"whatever": 1}}, "structured_outputs.whatever"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ],
)
def test_refused_with_a_400_naming_the_field(module_tenant_setup, body, param):
    r = _post(module_tenant_setup, "chat/completions", messages=USER, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_completions_truncate_prompt_tokens(module_tenant_setup):
    r = _post(
        module_tenant_setup,
        "completions",
        prompt="one two three four five six seven",
        max_tokens=1,
        truncate_prompt_tokens=2,
    )
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 2
