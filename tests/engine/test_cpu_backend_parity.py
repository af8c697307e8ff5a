"""The native CPU kernels (kernel_backend="cpu", what "auto" picks on CPU) against the same oracles
as the torch reference path: HF transformers greedy generation and peft.PeftModel."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from hf_oracle import hf_greedy, make_prompts
from lora_testlib import PeftOracle, make_adapters
from lora_testlib import make_prompts as make_lora_prompts
from safetensors.torch import load_file, save_file

from loraplex.engine import LLM, SamplingParams
from loraplex.kernels import cpu_native


def _chunked_cpu_llm(model_dir):
    """The native CPU backend with a 16-token budget and 40 small KV blocks: chunked prefill over
    cached prefixes, decodes of mixed lengths and preemption in one run."""
    return LLM(
        model=model_dir,
        dtype="float32",
        max_num_seqs=4,
        max_num_batched_tokens=16,
        block_size=4,
        num_kv_blocks=40,
        kernel_backend="cpu",
    )


# The inner loop keeps llama_gqa; the other architectures run in the whole suite.
@pytest.mark.parametrize(
    "variant", ["llama_gqa", *(pytest.param(v, marks=pytest.mark.slow) for v in ("qwen2_bias", "llama3_rope_tied"))]
)
def test_cpu_backend_greedy_matches_transformers(model_factory, variant):
    model_dir = model_factory(variant)
    max_new = 12
    # Chunked prefill over cached prefixes (16-token budget), decodes of mixed lengths, preemption.
    llm = _chunked_cpu_llm(model_dir)
    assert llm.engine.runner.ops.name == "cpu"
    prompts = make_prompts(14, llm.engine.model_config.vocab_size)
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_new, temperature=0.0, ignore_eos=True))
    expected = hf_greedy(model_dir, prompts, max_new)
    for i, (out, exp) in enumerate(zip(outs, expected)):
        assert out.token_ids == exp, f"prompt {i} (len {len(prompts[i])}) diverged"
    assert llm.engine.counters["preemptions"] > 0


@pytest.mark.parametrize("variant", ["qwen2_bias_bf16", "llama3_rope_tied_bf16"])
def test_packed_bf16_weights_match_transformers(model_factory, variant):
    """A bf16 checkpoint served in float32: every projection (q|k|v with bias, o, gate|up, down)
    and the output head (tied to the embedding) run decode steps on the native kernel's packed
    bf16 copy of its weight; greedy tokens still equal HF transformers' float32 model, under
    chunked prefill (the float32 GEMM) and preemption."""
    model_dir = model_factory(variant)
    llm = _chunked_cpu_llm(model_dir)
    model = llm.engine.runner.model
    projs = [p for ps in model.lora_projections().values() for p in ps]
    if cpu_native.pack_linear_weight(projs[0].weight) is None:
        pytest.skip("no AVX-512 build here: weights are never packed")
    assert all(p.packed is not None for p in projs) and model.packed_head is not None
    prompts = make_prompts(14, llm.engine.model_config.vocab_size)
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    expected = hf_greedy(model_dir, prompts, 12)
    for i, (out, exp) in enumerate(zip(outs, expected)):
        assert out.token_ids == exp, f"prompt {i} (len {len(prompts[i])}) diverged"
    assert llm.engine.counters["preemptions"] > 0


def test_weights_off_the_bf16_grid_are_not_packed(model_factory):
    """A float32 checkpoint (random weights off the bf16 grid): nothing is packed, so the served
    model is exactly the checkpoint's (the float32 parity test above runs that path)."""
    llm = LLM(model=model_factory("llama_gqa"), dtype="float32", max_num_seqs=2, num_kv_blocks=16, block_size=4)
    model = llm.engine.runner.model
    assert model.packed_head is None
    assert all(p.packed is None for ps in model.lora_projections().values() for p in ps)


def _cpu_llm(model_dir: str, lora_dtype: str) -> LLM:
    """The engine both PEFT parity tests run: float32 model, native kernels, eight adapter slots
    (prefill chunks of 32 tokens over 4-token blocks); only the adapters' storage dtype varies."""
    return LLM(
        model=model_dir,
        dtype="float32",
        kernel_backend="cpu",
        max_num_seqs=8,
        max_num_batched_tokens=32,
        block_size=4,
        max_loras=8,
        max_cpu_loras=8,
        max_lora_rank=16,
        lora_dtype=lora_dtype,
    )


def test_cpu_backend_mixed_adapters_match_peft(model_factory, tmp_path):
    model_dir = model_factory("llama_gqa")
    adapters = make_adapters(model_dir, tmp_path / "adapters")
    oracle = PeftOracle(model_dir, adapters)
    assign = ["attn_r8", "mlp_r4", None, "all_r16_rslora", "qv_down_patterns", "layer1_q_up", None, "attn_r8"]
    llm = _cpu_llm(model_dir, lora_dtype="model")  # the exact path: adapters in float32 like PEFT's
    assert llm.engine.lora.dtype == torch.float32
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    prompts = make_lora_prompts(len(assign), llm.engine.model_config.vocab_size, seed=2)
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), adapters=assign)
    for i, (prompt, adapter, out) in enumerate(zip(prompts, assign, outs)):
        assert out.token_ids == oracle.greedy(prompt, adapter, 8), f"request {i} (adapter {adapter}) diverged"


def test_packed_base_with_mixed_adapters_matches_peft(model_factory, tmp_path):
    """The packed bf16 base linears (a bf16 checkpoint in float32) with the SGMV adding each
    row's adapter on top, adapters of every kind and base rows mixed in one batch: greedy tokens
    equal PEFT's float32 model."""
    model_dir = model_factory("qwen2_bias_bf16")
    adapters = make_adapters(model_dir, tmp_path / "adapters")
    oracle = PeftOracle(model_dir, adapters)
    llm = _cpu_llm(model_dir, lora_dtype="model")
    projs = [p for ps in llm.engine.runner.model.lora_projections().values() for p in ps]
    if any(p.packed is None for p in projs):
        pytest.skip("no AVX-512 build here: weights are never packed")
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    assign = ["attn_r8", "mlp_r4", None, "all_r16_rslora", "qv_down_patterns", "layer1_q_up", None, "attn_r8"]
    prompts = make_lora_prompts(len(assign), llm.engine.model_config.vocab_size, seed=3)
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), adapters=assign)
    for i, (prompt, adapter, out) in enumerate(zip(prompts, assign, outs)):
        assert out.token_ids == oracle.greedy(prompt, adapter, 8), f"request {i} (adapter {adapter}) diverged"


def _rounded_to_float16(adapters: dict[str, str], root: Path) -> dict[str, str]:
    """Copies of the PEFT adapters whose weights went through float16 and back: what the engine
    serves with ``lora_dtype="float16"``, as an independent PEFT oracle."""
    out = {}
    for name, path in adapters.items():
        dst = root / name
        shutil.copytree(path, dst)
        tensors = load_file(str(dst / "adapter_model.safetensors"))
        save_file({k: v.half().float() for k, v in tensors.items()}, str(dst / "adapter_model.safetensors"))
        out[name] = str(dst)
    return out


def test_float16_adapter_storage_matches_peft(model_factory, tmp_path):
    """``lora_dtype="float16"`` beside a float32 model (what ``auto`` picks on an AVX-512 CPU):
    greedy tokens equal PEFT's with the adapters rounded to float16 (the only approximation is
    that rounding), and the chosen tokens' logprobs stay within 2e-3 of PEFT with the original
    float32 adapters (the documented tolerance, docs/cpu-performance.md)."""
    model_dir = model_factory("llama_gqa")
    adapters = make_adapters(model_dir, tmp_path / "adapters")
    rounded = _rounded_to_float16(adapters, tmp_path / "rounded")
    oracle16, oracle32 = PeftOracle(model_dir, rounded), PeftOracle(model_dir, adapters)
    assign = ["attn_r8", "mlp_r4", None, "all_r16_rslora", "qv_down_patterns", "layer1_q_up", None, "attn_r8"]
    llm = _cpu_llm(model_dir, lora_dtype="float16")
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    prompts = make_lora_prompts(len(assign), llm.engine.model_config.vocab_size, seed=2)
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompts, sp, adapters=assign)
    # Slots are allocated when the first adapter is written into them (the step above).
    projs = [p for ps in llm.engine.runner.model.lora_projections().values() for p in ps if p.lora_a is not None]
    assert projs and all(p.lora_a.dtype == p.lora_b.dtype == torch.float16 for p in projs)
    worst = 0.0
    for i, (prompt, adapter, out) in enumerate(zip(prompts, assign, outs)):
        assert out.token_ids == oracle16.greedy(prompt, adapter, 8), f"request {i} (adapter {adapter}) diverged"
        ref = oracle32.logprobs(prompt, out.token_ids, adapter)
        ours = torch.tensor([lp.logprob for lp in out.outputs[0].logprobs])
        worst = max(worst, float((ours - ref).abs().max()))
    assert worst < 2e-3, worst


def test_auto_lora_dtype_follows_the_kernels(model_factory):
    """auto: float16 storage only on the native kernels with in-register float16 conversion
    and a float32 model; the torch path (the oracle) and a bf16 model keep the model dtype."""
    model_dir = model_factory("llama_gqa")
    common = dict(model=model_dir, max_num_seqs=2, num_kv_blocks=16, block_size=4, max_lora_rank=8)
    cpu = LLM(dtype="float32", kernel_backend="cpu", **common).engine.lora
    assert cpu.dtype == (torch.float16 if cpu_native.fast_float16() else torch.float32)
    assert LLM(dtype="float32", kernel_backend="torch", **common).engine.lora.dtype == torch.float32
    assert LLM(dtype="bfloat16", kernel_backend="cpu", **common).engine.lora.dtype == torch.bfloat16
