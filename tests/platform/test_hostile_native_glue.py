"""Hostile checks of the native CPU glue (``cpu_elementwise.rotary``, ``cpu_elementwise.write_kv``, the
profiler ranges entered only under a profiler) where it runs by default: a bf16 engine on the
native CPU backend, and a real ``loraplex serve`` process.

The oracle is the torch twins: the same engine with ``rotary`` / ``write_kv`` replaced by
``kernels.reference``'s (``dataclasses.replace`` on ``runner.ops``). Both kernels are meant to be
bit for bit the twins, so the tokens and every logprob must be equal, not close: a mixed batch
(base + LoRA rows, greedy and seeded n > 1, prompt logprobs, a prompt from one token to several
blocks) run under a KV pool small enough to preempt, a grammar-constrained row, and a server's
greedy answers (completions by token ids, a stream, an adapter) against the in-process twins."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import pytest
import torch
from billing_helpers import auth, new_adapter, new_tenant
from harness.adapters import adapter_files, make_peft_adapter
from harness.serve import ServeProcess
from platform_helpers import ADMIN_KEY

from loraplex.engine import LLM, SamplingParams
from loraplex.kernels import cpu_elementwise, cpu_native, reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WORDS = "the quick brown fox jumps over a lazy dog and then "
# bf16 explicitly: "auto" picks float32 on a CPU without native bf16, where the twins run anyway.
ENGINE = {"dtype": "bfloat16", "max_num_seqs": 8, "max_loras": 2, "max_lora_rank": 8, "max_model_len": 1024}


def twins(ops):
    return dataclasses.replace(ops, rotary=reference.rotary, write_kv=reference.write_kv)


@pytest.fixture(scope="module")
def adapter_dir(demo_model_dir, tmp_path_factory) -> Path:
    # Every projection (q|k|v, o, gate|up, down): LoRA rows change what the rotation and the KV write see.
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return make_peft_adapter(demo_model_dir, tmp_path_factory.mktemp("glue") / "ada", r=8, alpha=16, targets=targets)


@pytest.fixture(scope="module")
def llm(demo_model_dir, adapter_dir):
    """A bf16 engine on the native CPU backend with a KV pool of 40 blocks of 16 tokens: the mixed
    batch below needs more, so it preempts (and recomputes) some sequences."""
    engine = LLM(model=str(demo_model_dir), num_kv_blocks=40, enable_prefix_caching=False, **ENGINE)
    if engine.engine.runner.ops.name != "cpu" or cpu_native._lib is None:
        pytest.skip("the native CPU kernels are not built here (no C++ compiler)")
    engine.add_adapter("ada", str(adapter_dir))
    return engine


class _Counted:
    """A ctypes function of the native library that counts its calls (the native branch ran, not
    the torch fallback)."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def _run(llm, ops, prompts, params, adapters):
    runner = llm.engine.runner
    saved, runner.ops = runner.ops, ops
    before = llm.engine.counters["preemptions"]
    try:
        outs = llm.generate(prompts, params, adapters=adapters)
    finally:
        runner.ops = saved
    return outs, llm.engine.counters["preemptions"] - before


def _digest(outs):
    return [
        (
            [(c.token_ids, c.text, c.finish_reason, [repr(lp) for lp in c.logprobs or []]) for c in o.outputs],
            [repr(lp) for lp in o.prompt_logprobs or []],
        )
        for o in outs
    ]


def test_a_preempting_mixed_batch_is_bit_for_bit_the_torch_twins(llm, monkeypatch):
    tok = llm.tokenizer
    prompts = [
        [tok.encode("Hi")[0]],  # one token: a one-token prefill (the decode kernel's path)
        "Once upon a time",
        WORDS * 12,  # several blocks
        "héllo 🤖 ∑ 日本語 \u202e שָׁלוֹם",
        WORDS * 40,  # ~440 tokens
        "The capital of France is",
        "Write a poem about the sea",
        "1, 2, 3, 4,",
    ]
    greedy = SamplingParams(max_tokens=48, temperature=0, logprobs=3, ignore_eos=True)
    seeded = SamplingParams(max_tokens=40, temperature=0.9, top_p=0.95, seed=11, n=2, logprobs=1, ignore_eos=True)
    plp = SamplingParams(max_tokens=8, temperature=0, prompt_logprobs=2, logprobs=1)
    params = [greedy, seeded, plp, greedy, greedy, seeded, greedy, plp]
    adapters = [None, "ada", "ada", None, "ada", None, "ada", None]

    native_ops = llm.engine.runner.ops
    rot = _Counted(cpu_native._lib.lp_rotary_bf16)
    kv = _Counted(cpu_native._lib.lp_write_kv)
    monkeypatch.setattr(cpu_native._lib, "lp_rotary_bf16", rot)
    monkeypatch.setattr(cpu_native._lib, "lp_write_kv", kv)
    native, preempted = _run(llm, native_ops, prompts, params, adapters)
    assert rot.calls > 0 and kv.calls > 0  # the native branches ran
    assert preempted > 0, "the KV pool was meant to force a preemption"
    calls = (rot.calls, kv.calls)
    torch_twins, _ = _run(llm, twins(native_ops), prompts, params, adapters)
    assert (rot.calls, kv.calls) == calls  # the twins never reached the native kernels
    assert _digest(native) == _digest(torch_twins)


def test_a_grammar_row_beside_free_rows_is_the_torch_twins(llm):
    from loraplex.engine import StructuredOutputSpec

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}  # fmt: skip
    spec = StructuredOutputSpec(kind="json_schema", value=json.dumps(schema))
    prompts = ["A person as JSON:", "Once upon a time", WORDS * 5]
    params = [
        SamplingParams(max_tokens=40, temperature=0, logprobs=2, structured_output=spec),
        SamplingParams(max_tokens=30, temperature=0.7, seed=5, logprobs=1),
        SamplingParams(max_tokens=30, temperature=0, logprobs=1),
    ]
    ops = llm.engine.runner.ops
    a, _ = _run(llm, ops, prompts, params, ["ada", None, "ada"])
    b, _ = _run(llm, twins(ops), prompts, params, ["ada", None, "ada"])
    assert _digest(a) == _digest(b)
    assert a[0].text.startswith("{")  # the grammar held (the object may be cut by max_tokens)


def test_an_adapter_that_overflows_bf16_is_still_the_torch_twins(llm, adapter_dir, tmp_path):
    """A hostile adapter (q and k LoRA B x 1e33) overflows the rotated q|k rows and the keys
    written to the cache (inf, then NaN downstream): the native rotation and KV copy must carry
    them exactly as the twins do. Either way the engine fails those requests with an error
    (tests/engine/test_nonfinite_output.py) and the base row beside them is untouched."""
    import shutil

    from safetensors.torch import load_file, save_file

    huge = tmp_path / "huge"
    shutil.copytree(adapter_dir, huge)
    f = huge / "adapter_model.safetensors"
    scaled = {
        k: v * (1e33 if "lora_B" in k and ("q_proj" in k or "k_proj" in k) else 1.0)
        for k, v in load_file(str(f)).items()
    }
    save_file(scaled, str(f))
    llm.add_adapter("huge", str(huge))
    try:
        prompts = ["Once upon a time", WORDS * 12, "1, 2, 3, 4,"]
        params = [
            SamplingParams(max_tokens=8, temperature=0, logprobs=3, ignore_eos=True),
            SamplingParams(max_tokens=8, temperature=0.8, seed=1, logprobs=2, ignore_eos=True),
            SamplingParams(max_tokens=8, temperature=0, logprobs=1, ignore_eos=True),  # a base row beside them
        ]
        ops = llm.engine.runner.ops
        a, _ = _run(llm, ops, prompts, params, ["huge", "huge", None])
        b, _ = _run(llm, twins(ops), prompts, params, ["huge", "huge", None])
        assert _digest(a) == _digest(b)
        assert [o.error is not None and "not finite" in o.error for o in a] == [True, True, False]
        assert [o.error is not None and "not finite" in o.error for o in b] == [True, True, False]
        assert all(lp.logprob == lp.logprob for lp in a[2].outputs[0].logprobs)  # the base row's are finite
    finally:
        llm.remove_adapter("huge")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_native_kv_write_is_the_twin_for_padding_strides_and_dtypes(dtype):
    if cpu_native._lib is None:
        pytest.skip("the native CPU kernels are not built here")
    g = torch.Generator().manual_seed(0)
    blocks, bs, h, d = 6, 4, 3, 8
    qkv = torch.randn(7, (4 + 2 * h) * d, generator=g).to(dtype)  # k and v: strided views, as the model's
    k = qkv[:, 4 * d : (4 + h) * d].view(7, h, d)
    v = qkv[:, (4 + h) * d :].view(7, h, d)
    slots = torch.tensor([5, -1, 0, 23, -7, 12, 1])
    caches = [torch.randn(blocks, bs, h, d, generator=g).to(dtype) for _ in range(2)]
    mine = [c.clone() for c in caches]
    cpu_elementwise.write_kv(mine[0], mine[1], k, v, slots)
    reference.write_kv(caches[0], caches[1], k, v, slots)
    assert torch.equal(mine[0], caches[0]) and torch.equal(mine[1], caches[1])


def test_the_native_rotary_is_the_twin_on_the_model_layout_and_specials():
    if cpu_native._lib is None:
        pytest.skip("the native CPU kernels are not built here")
    g = torch.Generator().manual_seed(1)
    t, hq, hk, d = 9, 9, 3, 64
    qkv = (torch.randn(t, (hq + 2 * hk) * d, generator=g) * 50).to(torch.bfloat16)
    qkv[0, 0], qkv[1, 5], qkv[2, 40] = float("inf"), float("-inf"), 3.0e38  # specials and an overflowing product
    x = qkv[:, : (hq + hk) * d].view(t, hq + hk, d)
    ang = torch.randn(t, 1, d // 2, generator=g) * 100
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    got, want = cpu_elementwise.rotary(x, cos, sin), reference.rotary(x, cos, sin)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


@pytest.fixture(scope="module")
def server(demo_model_dir, adapter_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("glue-serve")
    toml = "[engine]\nkv_cache_memory_gb = 0.05\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in ENGINE.items())
    proc = ServeProcess(root / "data", demo_model_dir, admin_key=ADMIN_KEY, config=toml, start_timeout=600)
    try:
        tid, key = new_tenant(proc.url, "glue")
        new_adapter(proc.url, "ada", tid, adapter_files(adapter_dir))
        yield proc, key, tid
    finally:
        proc.kill()
    log = proc.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def _server_completion(url, key, body):
    r = httpx.post(url + "/v1/completions", headers=auth(key), json=body, timeout=300)
    assert r.status_code == 200, r.text[:500]
    return r.json()["choices"]


def test_a_servers_greedy_answers_are_the_torch_twins(server, llm):
    proc, key, _ = server
    base = httpx.get(proc.url + "/v1/models", headers=auth(key), timeout=60).json()["data"]
    base_id = next(m["id"] for m in base if m["id"] != "ada")
    tok = llm.tokenizer
    cases = [(tok.encode("Once upon a time"), None), (tok.encode(WORDS * 9), "ada"), (tok.encode("1, 2, 3,"), "ada")]
    ops = llm.engine.runner.ops
    for ids, adapter in cases:
        want = _run(llm, twins(ops), [ids], SamplingParams(max_tokens=24, temperature=0, logprobs=1), [adapter])[0][0]
        want_lps = [lp.logprob for lp in want.outputs[0].logprobs]
        body = {"model": adapter or base_id, "prompt": ids, "max_tokens": 24, "temperature": 0, "logprobs": 1}
        (got,) = _server_completion(proc.url, key, body)
        assert got["text"] == want.text, (adapter, got["text"], want.text)
        assert got["logprobs"]["token_logprobs"] == want_lps
        # The same request streamed: the same text, chunk by chunk.
        with httpx.stream("POST", proc.url + "/v1/completions", headers=auth(key), json={**body, "stream": True},
                          timeout=300) as r:  # fmt: skip
            assert r.status_code == 200
            text = "".join(
                json.loads(line[6:])["choices"][0]["text"]
                for line in r.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]" and json.loads(line[6:])["choices"]
            )
        assert text == want.text


def test_a_server_fails_an_overflowing_adapters_requests_and_serves_the_rest(server, adapter_dir, tmp_path):
    """Over HTTP: an adapter whose q/k LoRA B is scaled 1e33 (NaN logits) gets a clear error —
    503 with the engine's reason, or on a stream an error event before [DONE] — never tokens with
    NaN logprobs; the base model and the sane adapter answer beside it."""
    import shutil

    from safetensors.torch import load_file, save_file

    proc, key, tenant = server
    huge = tmp_path / "huge"
    shutil.copytree(adapter_dir, huge)
    f = huge / "adapter_model.safetensors"
    save_file(
        {
            k: v * (1e33 if "lora_B" in k and ("q_proj" in k or "k_proj" in k) else 1.0)
            for k, v in load_file(str(f)).items()
        },
        str(f),
    )
    new_adapter(proc.url, "huge", tenant, adapter_files(huge))
    body = {"model": "huge", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "logprobs": 1}
    r = httpx.post(proc.url + "/v1/completions", headers=auth(key), json=body, timeout=300)
    assert r.status_code == 503, r.text[:500]
    assert "not finite" in r.json()["error"]["message"]
    with httpx.stream("POST", proc.url + "/v1/completions", headers=auth(key), json={**body, "stream": True},
                      timeout=300) as s:  # fmt: skip
        lines = [line for line in s.iter_lines() if line.startswith("data: ")] if s.status_code == 200 else []
        if s.status_code != 200:
            s.read()
            assert s.status_code == 503 and "not finite" in s.text
        else:
            events = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
            assert any("not finite" in (e.get("error") or {}).get("message", "") for e in events), events
            assert not any(c.get("text") for e in events for c in e.get("choices", [])), events
    for model in ("ada", None):  # the others are served as before
        base = next(m["id"] for m in httpx.get(proc.url + "/v1/models", headers=auth(key), timeout=60).json()["data"]
                    if m["id"] not in ("ada", "huge"))  # fmt: skip
        (got,) = _server_completion(proc.url, key, {**body, "model": model or base})
        assert got["text"] and all(lp == lp for lp in got["logprobs"]["token_logprobs"])
