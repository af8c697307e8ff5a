"""Greedy outputs must equal Hugging Face transformers' greedy generation, token for token."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from loraplex.engine import LLM, SamplingParams


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
            )
            outs.append(gen[0, len(p) :].tolist())
    return outs


def make_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 3, 5, 8, 13, 17, 24, 31, 40, 47, 9, 4, 60][:n]
    return [[rng.randrange(5, vocab) for _ in range(L)] for L in lengths]


@pytest.mark.parametrize("variant", ["llama_gqa", "llama_mha", "llama3_rope_tied", "qwen2_bias", "mistral"])
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
