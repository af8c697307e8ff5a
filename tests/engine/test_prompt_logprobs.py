"""vLLM's ``prompt_logprobs``: every prompt token's logprob given the tokens before it (with its rank
and the top-k), equal to Hugging Face transformers' log-softmax of the same prompt, whatever the
engine does to the prompt on the way: chunked prefill, preemption (a recomputed prompt is not
recorded twice), n > 1 (the prompt is shared), and a prefix the cache already holds (such a request
bypasses the cache: a cached prefix would skip the positions whose logits it needs)."""

from __future__ import annotations

import pytest
import torch
from hf_oracle import make_prompts
from transformers import AutoModelForCausalLM

from loraplex.engine import LLM, SamplingParams, model_runner

K = 3


def hf_prompt_logprobs(model, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab]: row p is the distribution of prompt token p + 1."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1)


def check(entries: list, prompt: list[int], expected: torch.Tensor, k: int) -> None:
    assert len(entries) == len(prompt) - 1
    for p, e in enumerate(entries):
        row, token = expected[p], prompt[p + 1]
        assert e.token_id == token
        assert e.logprob == pytest.approx(row[token].item(), abs=2e-4)
        assert e.rank == int((row > row[token]).sum()) + 1
        top = row.topk(k)
        assert [t for t, _ in e.top] == top.indices.tolist()
        assert [v for _, v in e.top] == pytest.approx(top.values.tolist(), abs=2e-4)


def test_prompt_logprobs_match_transformers_under_chunking_preemption_and_a_warm_prefix_cache(
    model_factory, monkeypatch
):
    model_dir = model_factory("llama_gqa")
    monkeypatch.setattr(model_runner, "PROMPT_LOGPROBS_ROWS", 5)  # a chunk's rows go in several slices
    # A 16-token budget chunks every longer prompt; 40 blocks of 4 tokens force preemption.
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_num_seqs=4,
        max_num_batched_tokens=16,
        block_size=4,
        num_kv_blocks=40,
        kernel_backend="torch",
        enable_prefix_caching=True,
    )
    prompts = make_prompts(14, llm.engine.model_config.vocab_size, seed=3)
    greedy = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
    # Warm the prefix cache with the longest prompts first, then ask for their prompt logprobs.
    long = [p for p in prompts if len(p) > 20]
    llm.generate(long, SamplingParams(**greedy))
    params = [SamplingParams(prompt_logprobs=K, n=2 if i % 3 == 0 else 1, **greedy) for i in range(len(prompts))]
    outs = llm.generate(prompts + long, params + [SamplingParams(prompt_logprobs=0, **greedy)] * len(long))
    assert llm.engine.counters["preemptions"] > 0, "the KV pool was meant to force preemption"
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for i, (out, prompt) in enumerate(zip(outs, prompts + long)):
        assert out.prompt_logprobs is not None
        check(out.prompt_logprobs, prompt, hf_prompt_logprobs(hf, prompt), K if i < len(prompts) else 0)
    # The one-token prompt has no prompt logprobs at all (the first token has none).
    assert outs[0].prompt_logprobs == [] and len(prompts[0]) == 1


def test_requests_without_prompt_logprobs_get_none_and_still_hit_the_prefix_cache(model_factory):
    model_dir = model_factory("llama_gqa")
    llm = LLM(model=model_dir, dtype="float32", block_size=4, kernel_backend="torch", enable_prefix_caching=True)
    prompt = make_prompts(10, llm.engine.model_config.vocab_size)[9]
    first = llm.generate([prompt], SamplingParams(max_tokens=2))[0]
    again = llm.generate([prompt], SamplingParams(max_tokens=2))[0]
    asked = llm.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=1))[0]
    assert first.prompt_logprobs is None and again.prompt_logprobs is None
    assert again.metrics["num_cached_tokens"] > 0  # the cache works for the others
    assert asked.metrics["num_cached_tokens"] == 0 and len(asked.prompt_logprobs) == len(prompt) - 1
