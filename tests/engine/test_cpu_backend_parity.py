"""The native CPU kernels (kernel_backend="cpu", what "auto" picks on CPU) against the same oracles
as the torch reference path: HF transformers greedy generation and peft.PeftModel."""

from __future__ import annotations

import pytest
from hf_oracle import hf_greedy, make_prompts
from lora_testlib import PeftOracle, make_adapters
from lora_testlib import make_prompts as make_lora_prompts

from loraplex.engine import LLM, SamplingParams


@pytest.mark.parametrize("variant", ["llama_gqa", "qwen2_bias", "llama3_rope_tied"])
def test_cpu_backend_greedy_matches_transformers(model_factory, variant):
    model_dir = model_factory(variant)
    max_new = 12
    # Chunked prefill over cached prefixes (16-token budget), decodes of mixed lengths, preemption.
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_num_seqs=4,
        max_num_batched_tokens=16,
        block_size=4,
        num_kv_blocks=40,
        kernel_backend="cpu",
    )
    assert llm.engine.runner.ops.name == "cpu"
    prompts = make_prompts(14, llm.engine.model_config.vocab_size)
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_new, temperature=0.0, ignore_eos=True))
    expected = hf_greedy(model_dir, prompts, max_new)
    for i, (out, exp) in enumerate(zip(outs, expected)):
        assert out.token_ids == exp, f"prompt {i} (len {len(prompts[i])}) diverged"
    assert llm.engine.counters["preemptions"] > 0


def test_cpu_backend_mixed_adapters_match_peft(model_factory, tmp_path):
    model_dir = model_factory("llama_gqa")
    adapters = make_adapters(model_dir, tmp_path / "adapters")
    oracle = PeftOracle(model_dir, adapters)
    assign = ["attn_r8", "mlp_r4", None, "all_r16_rslora", "qv_down_patterns", "layer1_q_up", None, "attn_r8"]
    llm = LLM(
        model=model_dir,
        dtype="float32",
        kernel_backend="cpu",
        max_num_seqs=8,
        max_num_batched_tokens=32,
        block_size=4,
        max_loras=8,
        max_cpu_loras=8,
        max_lora_rank=16,
    )
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    prompts = make_lora_prompts(len(assign), llm.engine.model_config.vocab_size, seed=2)
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), adapters=assign)
    for i, (prompt, adapter, out) in enumerate(zip(prompts, assign, outs)):
        assert out.token_ids == oracle.greedy(prompt, adapter, 8), f"request {i} (adapter {adapter}) diverged"
