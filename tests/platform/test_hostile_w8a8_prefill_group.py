"""Hostile tests of ``quantization = "w8a8"`` with ``prefill_group_tokens`` on a real ``loraplex
serve`` process hit by the ``openai`` client and httpx: invalid group sizes refused at start with a
clear one-line error, and a w8a8 server (groups of one token, off, or larger than any step) that
serves a mixed burst (long prompts, n > 1, streams with usage, streams cut by the client, an
adapter, two tenants, one of them flooding) with every request answered and counted."""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import subprocess

import httpx
import openai
import pytest
from billing_helpers import auth, new_adapter, new_tenant
from harness.serve import SMALL_KV, serve_argv

pytestmark = pytest.mark.slow

WORDS = "the quick brown fox jumps over a lazy dog and then "
MAX_MODEL_LEN = 1024


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("env", "-1", ">= 0"),
        ("env", "abc", "valid integer"),
        ("env", "1.5", "valid integer"),
        ("env", "true", "valid integer"),
        ("toml", "-1", ">= 0"),
        ("toml", '"abc"', "valid integer"),
        ("toml", "1.5", "fractional part"),
        # pydantic's lax mode read this as 1: the server started with groups of one token
        ("toml", "true", "not a boolean"),
    ],
)
def test_an_invalid_group_size_is_a_clear_error_at_start(tmp_path, demo_model_dir, where, value, says):
    env = {**os.environ, "LORAPLEX_ENGINE__MODEL": str(demo_model_dir), "LORAPLEX_ENGINE__QUANTIZATION": "w8a8"}
    args: list[str] = []
    if where == "env":
        env["LORAPLEX_ENGINE__PREFILL_GROUP_TOKENS"] = value
    else:
        config = tmp_path / "serve.toml"
        config.write_text(f'[engine]\nquantization = "w8a8"\nprefill_group_tokens = {value}\n')
        args = ["--config", str(config)]
    proc = subprocess.run(serve_argv(tmp_path / "data", 0, *args), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    named = [line for line in proc.stderr.splitlines() if "prefill_group_tokens" in line]
    assert named and says in named[0], proc.stderr[-3000:]


def _tokens(url: str, key: str, model: str, prompt: str) -> int:
    r = httpx.post(url + "/tokenize", headers=auth(key), json={"model": model, "prompt": prompt}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["count"]


def _completion(url: str, key: str, body: dict) -> dict:
    r = httpx.post(url + "/v1/completions", headers=auth(key), json=body, timeout=300)
    assert r.status_code == 200, (body.get("prompt", "")[:60], r.status_code, r.text[:500])
    return r.json()


def _stream(url: str, key: str, body: dict, *, cut_after: int | None = None) -> dict | None:
    """A streamed completion's usage chunk, or None when the client hangs up after ``cut_after``
    data chunks (the burst goes on without it)."""
    with httpx.Client(timeout=300) as c:
        with c.stream("POST", url + "/v1/completions", headers=auth(key), json={**body, "stream": True}) as r:
            assert r.status_code == 200, r.read()[:500]
            seen, usage, done = 0, None, False
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    assert "error" not in chunk, chunk
                    seen += 1
                    usage = chunk.get("usage") or usage
                    if cut_after is not None and seen >= cut_after:
                        return None
    assert done and usage is not None
    return usage


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("group", [1, 0, 10**9], ids=["one-token", "off", "huge"])
def test_w8a8_with_prefill_groups_serves_a_hostile_burst(tmp_path, demo_model_dir, good_files, serve_process, group):
    config = SMALL_KV + f'quantization = "w8a8"\nprefill_group_tokens = {group}\nmax_model_len = {MAX_MODEL_LEN}\n'
    server = serve_process(tmp_path / "data", demo_model_dir, config=config)
    url = server.url
    tid, key = new_tenant(url, "acme")
    _, flood_key = new_tenant(url, "flood")
    new_adapter(url, "bot", tid, good_files)
    models = httpx.get(url + "/v1/models", headers=auth(key), timeout=60).json()["data"]
    base = next(m["id"] for m in models if m["id"] != "bot")
    assert any(m["id"] == "bot" for m in models), models

    # A prompt longer than any group, a few tokens short of max_model_len (never cut: it is billed whole).
    near = WORDS * 100
    while _tokens(url, key, base, near) > MAX_MODEL_LEN - 8:
        near = near[: int(len(near) * 0.95)]
    prompts = [near, WORDS * 12, "héllo 🤖 ∑ 日本語 \u202e " * 5, *[(WORDS * 3)[: 7 + 29 * i] for i in range(5)]]
    counts = {p: _tokens(url, key, base, p) for p in prompts}

    def plain(i: int) -> None:
        p = prompts[i % len(prompts)]
        model = "bot" if i % 5 == 0 else base
        body = {"model": model, "prompt": p, "max_tokens": 6, "temperature": 0, "n": 3 if i % 3 == 0 else 1}
        out = _completion(url, key, body)
        texts = [c["text"] for c in out["choices"]]
        assert len(texts) == body["n"] and len(set(texts)) == 1, texts  # greedy: the same for every choice
        assert out["usage"]["prompt_tokens"] == counts[p]
        assert out["usage"]["completion_tokens"] <= 6 * body["n"]
        assert all(c["finish_reason"] in ("length", "stop") for c in out["choices"])

    def streamed(i: int) -> None:
        p = prompts[i % len(prompts)]
        body = {"model": base, "prompt": p, "max_tokens": 6, "temperature": 0}
        if i % 2:
            assert _stream(url, key, body, cut_after=1) is None  # the client hangs up mid-stream
            return
        usage = _stream(url, key, {**body, "stream_options": {"include_usage": True}})
        assert usage is not None and usage["prompt_tokens"] == counts[p] and 1 <= usage["completion_tokens"] <= 6

    def flood(i: int) -> None:
        body = {"model": base, "prompt": WORDS * (1 + i % 8), "max_tokens": 4, "temperature": 0}
        _completion(url, flood_key, body)

    jobs = [(plain, i) for i in range(10)] + [(streamed, i) for i in range(8)] + [(flood, i) for i in range(12)]
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(fn, i) for fn, i in jobs]
        for f in cf.as_completed(futures, timeout=1200):
            f.result()

    # After the burst (and its hung-up streams): logprobs finite, text decodes, /metrics answers.
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=base,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    lps = [t.logprob for t in reply.choices[0].logprobs.content]
    assert lps and all(math.isfinite(x) and x <= 0 for x in lps), lps
    assert reply.usage.completion_tokens == len(lps)
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    shaped = client.chat.completions.create(
        model="bot",
        messages=[{"role": "user", "content": "Give an age as JSON"}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
        max_tokens=30,
        temperature=0,
    )
    if shaped.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(shaped.choices[0].message.content)["age"], int)
    assert httpx.get(url + "/metrics", timeout=60).status_code == 200
    assert "Traceback" not in server.output()
