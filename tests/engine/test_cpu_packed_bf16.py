"""A bf16 model on the native CPU backend with its linear weights packed at load
(``kernels/cpu_packed.py``; CPUs with native bf16: oneDNN's copy on ``amx``, pair panels for our
vdpbf16ps kernel on ``avx512_bf16``) against the same engine with plain weights and
``F.linear`` (``LORAPLEX_CPU_KIND=none``, what a CPU without native bf16 runs): greedy tokens and
logprobs, base rows and mixed adapters, under chunked prefill and preemption. Also the prefill
path of whole prompts through SDPA (``cpu_native.SDPA_MIN_ROWS``) against HF transformers."""

from __future__ import annotations

import random

import pytest
import torch
from hf_oracle import hf_greedy, make_prompts
from lora_testlib import make_adapters

from loraplex.engine import LLM, EngineConfigError, SamplingParams, resolved_config
from loraplex.engine.config import EngineConfig
from loraplex.kernels import (
    cpu_elementwise,
    cpu_native,
    cpu_packed,
    cpu_prompt_attention,
    packed_replaces_weight,
    pair_panels,
    reference,
)
from loraplex.kernels.ops import replaced_weight


def _llm(model_dir: str, monkeypatch, kind: str) -> LLM:
    monkeypatch.setenv("LORAPLEX_CPU_KIND", kind)
    return LLM(
        model=model_dir,
        dtype="bfloat16",
        kernel_backend="cpu",
        max_num_seqs=4,
        max_num_batched_tokens=16,
        block_size=4,
        num_kv_blocks=40,
    )


def _run(llm: LLM, prompts, adapters=None):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompts, params, adapters=adapters)
    return [o.token_ids for o in outs], [[t.logprob for t in o.outputs[0].logprobs] for o in outs]


def _form(packed) -> str:
    return "onednn" if packed.is_mkldnn else "pair_panels" if pair_panels.is_packed(packed) else "other"


@pytest.mark.parametrize("kind,bf16", [("amx", "onednn"), ("avx512_bf16", "onednn"), ("avx512_bf16", "pair_panels")])
@pytest.mark.parametrize("variant", ["qwen2_bias_bf16", "llama3_rope_tied_bf16"])
def test_packed_bf16_model_matches_plain_weights(model_factory, monkeypatch, tmp_path, variant, kind, bf16):
    if not cpu_packed.onednn_bf16():
        pytest.skip(
            "this CPU cannot run oneDNN's bf16 path (it needs avx512bw/vl/dq or avx_ne_convert): nothing is packed"
        )
    model_dir = model_factory(variant)
    adapters = make_adapters(model_dir, tmp_path / "adapters")
    plain = _llm(model_dir, monkeypatch, "none")
    projs = [p for ps in plain.engine.runner.model.lora_projections().values() for p in ps]
    assert all(p.packed is None and p.weight is not None for p in projs)
    monkeypatch.setenv("LORAPLEX_BF16_LINEAR", bf16)
    packed = _llm(model_dir, monkeypatch, kind)
    model = packed.engine.runner.model
    assert resolved_config(packed.engine)["linear_weights"].startswith(
        "pair panels" if bf16 == "pair_panels" and cpu_packed.pair_panels_available() else "oneDNN packed"
    )
    projs = [p for ps in model.lora_projections().values() for p in ps]
    # Every projection's plain weight was replaced by the packed copy (no memory added), the head
    # packed beside its weight (the embedding, when tied); the kind's form where the shape allows.
    panels = bf16 == "pair_panels" and cpu_packed.pair_panels_available()
    assert all(p.weight is None and packed_replaces_weight(p.packed) for p in projs)
    assert model.packed_head is not None and packed_replaces_weight(model.packed_head)
    for p in [*projs, model.packed_head]:
        copy = p if isinstance(p, torch.Tensor) else p.packed
        fits = pair_panels.fits(replaced_weight(copy))
        assert _form(copy) == ("pair_panels" if panels and fits else "onednn")
    if panels:
        assert any(_form(p.packed) == "pair_panels" for p in projs), "no projection took the pair panels"
    assert all(p.compute_dtype == torch.bfloat16 for p in projs)
    prompts = make_prompts(14, packed.engine.model_config.vocab_size, seed=4)
    want_tokens, want_lp = _run(plain, prompts)
    got_tokens, got_lp = _run(packed, prompts)
    assert got_tokens == want_tokens
    assert packed.engine.counters["preemptions"] > 0  # the run did go through preemption
    for a, b in zip(got_lp, want_lp):  # the chosen tokens' logprobs (bf16 logits: a few ulps)
        assert a == pytest.approx(b, abs=0.05)
    # Adapters on top of the packed base (SGMV over bf16 slots), base rows mixed in.
    for name, path in adapters.items():
        plain.add_adapter(name, path)
        packed.add_adapter(name, path)
    assign = ["attn_r8", None, "mlp_r4", "all_r16_rslora", None, "attn_r8", "qv_down_patterns"] * 2
    want_tokens, _ = _run(plain, prompts, assign)
    got_tokens, _ = _run(packed, prompts, assign)
    assert got_tokens == want_tokens


def test_float32_model_is_not_onednn_packed(model_factory, monkeypatch):
    """On any kind a float32 model keeps its float32 weights (only the native decode panels beside
    them): the oneDNN path is for bf16 models."""
    monkeypatch.setenv("LORAPLEX_CPU_KIND", "amx")
    assert cpu_packed.cpu_kind().name == "amx"
    llm = LLM(model=model_factory("qwen2_bias_bf16"), dtype="float32", kernel_backend="cpu", num_kv_blocks=16)
    projs = [p for ps in llm.engine.runner.model.lora_projections().values() for p in ps]
    assert all(p.weight is not None and (p.packed is None or not p.packed.is_mkldnn) for p in projs)


@pytest.mark.parametrize("variant", ["llama_gqa", "qwen2_bias"])
def test_whole_prompts_on_sdpa_match_transformers(model_factory, monkeypatch, variant):
    """Prompts of 64-100 tokens prefilled whole in one step (the default budget) take the SDPA
    prefill path (``cpu_native.SDPA_MIN_ROWS``), equal-length ones batched; greedy tokens equal HF
    transformers' float32 model."""
    model_dir = model_factory(variant)
    llm = LLM(model=model_dir, dtype="float32", kernel_backend="cpu", max_num_seqs=8, num_kv_blocks=64)
    vocab = llm.engine.model_config.vocab_size
    rng = random.Random(5)
    lengths = [64, 64, 77, 100, 64, 90]
    assert min(lengths) >= cpu_native.SDPA_MIN_ROWS
    prompts = [[rng.randrange(5, vocab) for _ in range(n)] for n in lengths]
    calls = []
    real = cpu_prompt_attention.fresh_sdpa
    monkeypatch.setattr(cpu_prompt_attention, "fresh_sdpa", lambda *a: calls.append(a[5]) or real(*a))
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert calls, "no prompt took the SDPA path"
    assert [o.token_ids for o in outs] == hf_greedy(model_dir, prompts, 8)


@pytest.mark.parametrize("variant", ["qwen2_bias_bf16", "llama3_rope_tied_bf16"])
def test_fused_bf16_glue_matches_torch_twins(model_factory, monkeypatch, variant):
    """The native one-pass RMSNorm and SiLU x up (``csrc/cpu_elementwise.cpp``) of a bf16 model
    against the same engine on their torch twins: greedy tokens equal, logprobs within bf16 noise,
    under chunked prefill and preemption."""
    if not cpu_packed.onednn_bf16():
        pytest.skip(
            "this CPU cannot run oneDNN's bf16 path (it needs avx512bw/vl/dq or avx_ne_convert): nothing is packed"
        )
    model_dir = model_factory(variant)
    fused = _llm(model_dir, monkeypatch, "amx")
    assert fused.engine.runner.ops.rms_norm is cpu_elementwise.rms_norm
    monkeypatch.setattr(cpu_elementwise, "rms_norm", reference.rms_norm)
    monkeypatch.setattr(cpu_elementwise, "silu_mul", reference.silu_mul)
    twins = _llm(model_dir, monkeypatch, "amx")
    assert twins.engine.runner.ops.rms_norm is reference.rms_norm
    prompts = make_prompts(14, fused.engine.model_config.vocab_size, seed=5)
    want_tokens, want_lp = _run(twins, prompts)
    got_tokens, got_lp = _run(fused, prompts)
    assert got_tokens == want_tokens
    assert fused.engine.counters["preemptions"] > 0
    for a, b in zip(got_lp, want_lp):
        assert a == pytest.approx(b, abs=0.05)


@pytest.mark.parametrize("var,value", [("LORAPLEX_BF16_LINEAR", "mkl"), ("LORAPLEX_CPU_KIND", "sapphire")])
def test_unknown_cpu_override_refuses_the_config(model_factory, monkeypatch, var, value):
    """A typo in an environment override is an EngineConfigError naming it, raised while the
    configuration is built (before any weight is read), whatever the backend."""
    monkeypatch.setenv(var, value)
    with pytest.raises(EngineConfigError, match=var):
        EngineConfig(model=model_factory("qwen2_bias_bf16"), kernel_backend="torch")
