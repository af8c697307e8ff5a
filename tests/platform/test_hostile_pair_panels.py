"""Hostile checks of the pair-panel bf16 linear (``kernels/csrc/cpu_linear_bf16.cpp`` over
``kernels/pair_panels.py``, the ``avx512_bf16`` kind's default; ``LORAPLEX_BF16_LINEAR`` swaps it
with oneDNN's packed copy) in an in-process engine and a real ``loraplex serve`` process.

What must hold (and does): with ``batch_invariant`` a seeded request's tokens and logprobs are the
same to the bit alone and inside a mixed, preempting batch of other tenants' adapters, n > 1 and a
grammar row (docs/openai-api.md "Seeds and the batch"), in process and over HTTP; speculative
decoding keeps greedy output equal to plain decoding; the two bf16 linears agree up to near-ties;
a server on the panels answers a concurrent mix (streams, n > 1, tools, json_schema, logprobs,
echo + prompt logprobs, hostile strings) with no 5xx while an adapter is deleted under it.

Found by this run and fixed: an unknown ``LORAPLEX_BF16_LINEAR`` was silently accepted on a CPU
kind without native bf16 (it is now refused on every kind), and ``--replicas 2`` checked it only
inside the Ray replicas (exit 1 after hundreds of traceback lines, replicas retried; the replica's
``__del__`` then failed on what its ``__init__`` never built): the CLI now checks it first and
prints one ``error:`` line, exit 2 (docs/deploy.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from billing_helpers import auth, new_adapter, new_tenant
from harness.adapters import adapter_files, make_peft_adapter
from harness.net import free_port_below_ephemeral
from harness.serve import ServeProcess, serve_argv
from hostile_http_helpers import fire
from platform_helpers import ADMIN_KEY

from loraplex.engine import LLM, EngineConfigError, SamplingParams, StructuredOutputSpec, resolved_config
from loraplex.engine.config import EngineConfig
from loraplex.kernels import cpu_native, cpu_packed, pair_panels

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WORDS = "the quick brown fox jumps over a lazy dog and then "
ENGINE = {"dtype": "bfloat16", "max_num_seqs": 8, "max_loras": 2, "max_lora_rank": 8, "max_model_len": 1024}


def _panels_here() -> bool:
    return cpu_native.available() and cpu_packed.onednn_bf16() and cpu_packed.pair_panels_available()


needs_panels = pytest.mark.skipif(not _panels_here(), reason="no AVX512-BF16 pair-panel kernel on this CPU")


@pytest.fixture(scope="module")
def adapters(demo_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("panels-adapters")
    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return {
        "ada": make_peft_adapter(demo_model_dir, root / "ada", r=8, alpha=16, targets=every),
        "ada2": make_peft_adapter(
            demo_model_dir, root / "ada2", r=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"), seed=5
        ),
    }


def _engine(model_dir: Path, adapters: dict[str, Path], bf16: str, **kw) -> LLM:
    with pytest.MonkeyPatch.context() as mp:  # read at load only
        mp.setenv("LORAPLEX_BF16_LINEAR", bf16)
        mp.delenv("LORAPLEX_CPU_KIND", raising=False)
        llm = LLM(model=str(model_dir), **{**ENGINE, **kw})
    for name, path in adapters.items():
        llm.add_adapter(name, str(path))
    return llm


def _digest(outs):
    return [
        ([(c.token_ids, c.text, c.finish_reason, [repr(lp) for lp in c.logprobs or []]) for c in o.outputs], o.error)
        for o in outs
    ]


# --- found by the hostile run, fixed: the refusal of an unknown LORAPLEX_BF16_LINEAR everywhere ---


def test_an_unknown_bf16_linear_is_refused_on_a_kind_without_native_bf16(demo_model_dir, monkeypatch):
    """docs/deploy.md: an unknown ``LORAPLEX_BF16_LINEAR`` stops ``loraplex serve`` with one
    ``error:`` line (exit 2). On kind ``none`` (every CPU without AVX512-BF16/AMX, or forced as
    here) ``bf16_linear`` used to return before it validated the value, so the typo went through
    and the server started; it is refused there as on ``avx512_bf16``."""
    monkeypatch.setenv("LORAPLEX_BF16_LINEAR", "mkl")
    monkeypatch.setenv("LORAPLEX_CPU_KIND", "avx512_bf16")
    with pytest.raises(EngineConfigError, match="LORAPLEX_BF16_LINEAR"):
        EngineConfig(model=str(demo_model_dir), dtype="bfloat16", num_kv_blocks=16, max_num_seqs=2)
    monkeypatch.setenv("LORAPLEX_CPU_KIND", "none")
    with pytest.raises(EngineConfigError, match="LORAPLEX_BF16_LINEAR"):
        EngineConfig(model=str(demo_model_dir), dtype="bfloat16", num_kv_blocks=16, max_num_seqs=2)


def test_replicas_with_an_unknown_bf16_linear_is_one_line_and_exit_2(tmp_path, demo_model_dir):
    """``loraplex serve --replicas 2`` (Ray Serve) with ``LORAPLEX_BF16_LINEAR=mkl``: the value was
    only checked inside each engine replica, so Ray retried the replicas, every one died with the
    EngineConfigError traceback (and ``EngineReplica.__del__`` then raised AttributeError
    '_stop'), and the CLI exited 1 after hundreds of stderr lines. The CLI now checks the overrides
    before Ray starts: the documented one ``error:`` line and exit 2."""
    from loraplex.platform.cluster import deploy

    if not deploy.ray_serve_installed():
        pytest.skip("ray[serve] is not installed")
    data = tmp_path / "data"
    data.mkdir()
    env = {
        **os.environ,
        "LORAPLEX_ENGINE__MODEL": str(demo_model_dir),
        "LORAPLEX_ADMIN_KEY": ADMIN_KEY,
        "LORAPLEX_BF16_LINEAR": "mkl",
        "RAY_DEDUP_LOGS": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "TOKENIZERS_PARALLELISM": "false",
    }
    argv = serve_argv(data, free_port_below_ephemeral(), "--replicas", "2")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        stderr = "(still running after 400 s: killed)"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # this run's Ray processes only (its own session)
        except ProcessLookupError:
            pass
        proc.wait(30)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, (proc.returncode, stderr[-3000:])
    assert len(errors) == 1 and "LORAPLEX_BF16_LINEAR" in errors[0], stderr[-3000:]
    assert "Traceback" not in stderr


# --- guarantees that hold on the pair panels ---


@needs_panels
def test_batch_invariant_seeded_rows_on_panels_are_the_same_alone_and_in_a_preempting_mix(demo_model_dir, adapters):
    """``batch_invariant`` on the panels: every row (seeded n = 2, greedy, a json_schema row, base
    and two adapters, prompts of 1 to ~530 tokens) gives the same tokens and logprobs, to the bit,
    alone in a roomy engine and inside one batch in an engine whose KV pool forces preemption."""
    small = _engine(demo_model_dir, adapters, "pair_panels", batch_invariant=True, num_kv_blocks=44,
                    enable_prefix_caching=False)  # fmt: skip
    assert resolved_config(small.engine)["linear_weights"] == "pair panels x17"
    projs = [p for ps in small.engine.runner.model.lora_projections().values() for p in ps]
    assert all(pair_panels.is_packed(p.packed) for p in projs)
    tok = small.tokenizer
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = StructuredOutputSpec(kind="json_schema", value=json.dumps(schema))
    prompts = [[tok.encode("Hi")[0]], "Once upon a time", WORDS * 30, "\u202e🤖 日本語 \u0000", WORDS * 40, "1, 2, 3,",
               "A JSON object:", WORDS * 12]  # fmt: skip
    adapters_of = [None, "ada", "ada2", "ada", None, "ada2", "ada", None]
    params = [
        SamplingParams(max_tokens=24, temperature=1.0, seed=100 + i, n=1 + i % 2, logprobs=2, ignore_eos=True)
        for i in range(len(prompts))
    ]
    params[5] = SamplingParams(max_tokens=24, temperature=0, logprobs=3, ignore_eos=True)
    params[6] = SamplingParams(max_tokens=24, temperature=0.8, seed=9, logprobs=1, structured_output=spec)
    before = small.engine.counters["preemptions"]
    mixed = small.generate(prompts, params, adapters=adapters_of)
    assert small.engine.counters["preemptions"] > before, "the KV pool was meant to force a preemption"
    roomy = _engine(demo_model_dir, adapters, "pair_panels", batch_invariant=True, num_kv_blocks=400,
                    enable_prefix_caching=True)  # fmt: skip
    alone = [roomy.generate([p], s, adapters=[a])[0] for p, s, a in zip(prompts, params, adapters_of)]
    again = roomy.generate(prompts, params, adapters=adapters_of)  # prefix-cache hits this time
    assert _digest(mixed) == _digest(alone)
    assert _digest(again) == _digest(alone)
    assert all(o.error is None for o in mixed)


@needs_panels
def test_panels_speculation_and_onednn_agree(demo_model_dir, adapters):
    """On the panels, ngram speculation keeps greedy output equal to plain decoding (docs/
    quantization-and-speculation.md) with adapters mixed; the oneDNN copy gives the same tokens up
    to near-ties (compared on the common prefix: logprobs within 0.05)."""
    prompts = ["Once upon a time in a land", WORDS * 30, "hi", WORDS * 5, "1,2,3", "日本語 🤖", WORDS * 12, "x"]
    adapters_of = [None, "ada", "ada2", None, "ada", None, "ada2", "ada"]
    greedy = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=1)
    spec = _engine(demo_model_dir, adapters, "pair_panels", num_kv_blocks=300, speculative_method="ngram")
    plain = _engine(demo_model_dir, adapters, "pair_panels", num_kv_blocks=300)
    onednn = _engine(demo_model_dir, adapters, "onednn", num_kv_blocks=300)
    assert resolved_config(spec.engine)["linear_weights"] == "pair panels x17"
    assert resolved_config(onednn.engine)["linear_weights"] == "oneDNN packed x17"
    want = plain.generate(prompts, greedy, adapters=adapters_of)
    got = spec.generate(prompts, greedy, adapters=adapters_of)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    other = onednn.generate(prompts, greedy, adapters=adapters_of)
    for a, b in zip(want, other):
        ta, tb = a.outputs[0].token_ids, b.outputs[0].token_ids
        n = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta))
        for la, lb in zip(a.outputs[0].logprobs[:n], b.outputs[0].logprobs[:n]):
            assert la.logprob == pytest.approx(lb.logprob, abs=0.05)


@pytest.fixture(scope="module")
def server(demo_model_dir, adapters, tmp_path_factory):
    if not _panels_here():
        pytest.skip("no AVX512-BF16 pair-panel kernel on this CPU")
    root = tmp_path_factory.mktemp("panels-serve")
    engine = {**ENGINE, "max_num_seqs": 16, "batch_invariant": True}
    toml = "[engine]\nkv_cache_memory_gb = 0.004\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in engine.items())
    proc = ServeProcess(root / "data", demo_model_dir, admin_key=ADMIN_KEY, config=toml,
                        env={"LORAPLEX_BF16_LINEAR": "pair_panels"}, start_timeout=600)  # fmt: skip
    try:
        tid_a, key_a = new_tenant(proc.url, "panels-a")
        tid_b, key_b = new_tenant(proc.url, "panels-b")
        new_adapter(proc.url, "ada", tid_a, adapter_files(adapters["ada"]))
        ada2 = new_adapter(proc.url, "ada2", tid_b, adapter_files(adapters["ada2"]))
        yield proc, key_a, key_b, ada2
    finally:
        proc.kill()
    log = proc.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_a_panels_server_keeps_seeds_and_serves_a_hostile_mix_while_an_adapter_goes(server):
    """Over HTTP on the panels with ``batch_invariant``: a seeded n = 2 request with logprobs is the
    same alone and sent while 36 other requests of two tenants are in flight (streams, n > 1,
    tools with each tool_choice, json_schema, top_logprobs, echo + prompt_logprobs, hostile
    strings) and tenant B's adapter is deleted; every answer is 200, or 404/409 for the deleted
    adapter's requests; no 5xx, every 200 stream ends with [DONE], no traceback in the log."""
    import concurrent.futures as cf

    proc, key_a, key_b, ada2 = server
    assert "pair panels x17" in proc.log.read_text(errors="replace")
    seeded = {"model": "ada", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 1.0, "seed": 7,
              "logprobs": 3, "n": 2}  # fmt: skip
    status, alone = fire(proc.url, key_a, "/v1/completions", seeded)
    assert status == 200, alone[:500]
    tool = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["a", "b"],
    }
    texts = ["", " ", "\u0000", "\ud7ff" * 40, "<|endoftext|>" * 20, "<|assistant|>\n", "🤖" * 60, WORDS * 20]
    crowd = []
    for i in range(36):
        key, model = [(key_a, "ada"), (key_a, "demo"), (key_b, "ada2"), (key_b, "demo")][i % 4]
        text, kind = texts[i % len(texts)], (i // 4) % 6
        msgs = [{"role": "user", "content": text}]
        if kind == 0:
            body = ("/v1/completions", {"model": model, "prompt": text or "x", "max_tokens": 1 + i, "n": 3,
                                        "temperature": 0.7, "logprobs": 5, "seed": i})  # fmt: skip
        elif kind == 1:
            body = ("/v1/completions", {"model": model, "prompt": text or "x", "max_tokens": 30, "stream": True,
                                        "n": 2, "logprobs": 2})  # fmt: skip
        elif kind == 2:
            choice = ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}][i % 3]
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 40, "tools": tool,
                                             "tool_choice": choice, "n": 2})  # fmt: skip
        elif kind == 3:
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 40, "logprobs": True,
                    "top_logprobs": 3, "response_format": {"type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema}}})  # fmt: skip
        elif kind == 4:
            body = ("/v1/completions", {"model": model, "prompt": text or "x", "max_tokens": 12, "echo": True,
                                        "logprobs": 3, "prompt_logprobs": 2})  # fmt: skip
        else:
            body = ("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 30, "stream": True,
                    "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2})  # fmt: skip
        crowd.append((key, model, *body))
    with cf.ThreadPoolExecutor(16) as ex:
        futures = [ex.submit(fire, proc.url, key, path, body) for key, _, path, body in crowd]
        status, amid = fire(proc.url, key_a, "/v1/completions", seeded)
        gone = httpx.delete(proc.url + f"/admin/v1/adapters/{ada2}", headers=auth(ADMIN_KEY), timeout=60)
        results = [f.result() for f in futures]
    assert gone.status_code == 200, gone.text
    assert status == 200, amid[:500]

    def choices(text):
        return [(c["text"], c["logprobs"]["token_logprobs"], c["logprobs"]["top_logprobs"])
                for c in json.loads(text)["choices"]]  # fmt: skip

    assert choices(amid) == choices(alone)
    for (_, model, path, body), (code, text) in zip(crowd, results):
        allowed = {200, 404, 409} if model == "ada2" else {200}
        assert code in allowed, (
            code,
            path,
            {k: v for k, v in body.items() if k not in ("prompt", "messages")},
            text[:300],
        )
    assert sum(code == 200 for code, _ in results) >= 27  # every request of the other three models
