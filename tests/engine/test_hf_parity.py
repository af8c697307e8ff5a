"""Greedy outputs must equal Hugging Face transformers' greedy generation, token for token."""

from __future__ import annotations

import pytest
from hf_oracle import hf_greedy, make_prompts

from loraplex.engine import LLM, SamplingParams


# One case of the oracle stays in the inner loop (llama_gqa); the other architectures run in the whole suite.
@pytest.mark.parametrize(
    "variant",
    [
        "llama_gqa",
        *(pytest.param(v, marks=pytest.mark.slow) for v in ("llama_mha", "llama3_rope_tied", "qwen2_bias", "mistral")),
    ],
)
def test_greedy_matches_transformers_under_chunking_and_preemption(model_factory, variant):
    model_dir = model_factory(variant)
    max_new = 12
    # Small everything: a 16-token budget chunks every prompt longer than 16; 40 blocks of 4 tokens
    # hold ~160 tokens while the 4 running sequences want up to ~290, so sequences get preempted.
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_num_seqs=4,
        max_num_batched_tokens=16,
        block_size=4,
        num_kv_blocks=40,
        kernel_backend="torch",
    )
    prompts = make_prompts(14, llm.engine.model_config.vocab_size)
    outs = llm.generate(prompts, SamplingParams(max_tokens=max_new, temperature=0.0, ignore_eos=True))
    expected = hf_greedy(model_dir, prompts, max_new)
    for i, (out, exp) in enumerate(zip(outs, expected)):
        assert out.token_ids == exp, f"prompt {i} (len {len(prompts[i])}) diverged"
        assert out.finish_reason == "length"
    assert llm.engine.counters["preemptions"] > 0, "the KV pool was meant to force preemption"
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
