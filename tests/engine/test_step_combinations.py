"""The step where features meet. One continuous batch mixes speculative decoding (n-gram drafts in
``spec_token_ids``) with n > 1 forks that speculate on copy-on-write blocks, a grammar-constrained
request, logprobs, a stop string, penalties and two adapters, under a budget that chunks prompts and
a KV pool that preempts. Oracle: the very same batch without speculation — every request here is
greedy, so speculation may not change a single token, and the requests that never speculate
(grammar, logprobs, stop strings, penalties) must be untouched by their speculating neighbours."""

from __future__ import annotations

import json
import random

import pytest
from lora_testlib import make_peft_adapter

from loraplex.engine import LLM, SamplingParams, StructuredOutputSpec

TIGHT = dict(
    dtype="float32",
    kernel_backend="torch",
    max_num_seqs=8,
    max_num_batched_tokens=20,
    block_size=4,
    num_kv_blocks=60,
    max_lora_rank=8,
)


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("combo")
    return {
        "a1": make_peft_adapter(
            tiny_llama, root / "a1", seed=1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]
        ),
        "a2": make_peft_adapter(tiny_llama, root / "a2", seed=2, r=4, lora_alpha=8, target_modules=["down_proj"]),
    }


def _batch() -> tuple[list[list[int]], list[SamplingParams], list[str | None]]:
    rng = random.Random(7)
    spans = [[rng.randrange(5, 700) for _ in range(rng.randint(2, 4))] for _ in range(7)]
    prompts = [(s * 10)[: rng.randint(8, 30)] for s in spans]  # repetitive: prompt lookup proposes
    greedy = dict(temperature=0.0, ignore_eos=True)
    params = [
        SamplingParams(max_tokens=18, **greedy),
        SamplingParams(n=3, max_tokens=14, **greedy),  # forks, then each speculates on shared blocks
        SamplingParams(max_tokens=12, logprobs=2, **greedy),
        SamplingParams(max_tokens=24, structured_output=StructuredOutputSpec("json_object"), temperature=0.0),
        SamplingParams(max_tokens=16, stop=["zz"], **greedy),
        SamplingParams(max_tokens=16, repetition_penalty=1.3, **greedy),
        SamplingParams(max_tokens=20, **greedy),
    ]
    adapters = [None, "a1", "a2", None, "a1", None, "a2"]
    return prompts, params, adapters


def _run(model: str, adapters: dict, **extra) -> tuple[LLM, list]:
    llm = LLM(model=model, **TIGHT, **extra)
    for name, path in adapters.items():
        llm.add_adapter(name, path)
    prompts, params, names = _batch()
    return llm, llm.generate(prompts, params, adapters=names)


@pytest.mark.parametrize("k", [2, pytest.param(5, marks=pytest.mark.slow)])  # the inner loop keeps k = 2
def test_speculation_changes_nothing_in_a_batch_of_every_feature(tiny_llama, adapters, k):
    _, plain = _run(tiny_llama, adapters)
    llm, spec = _run(tiny_llama, adapters, speculative_method="ngram", num_speculative_tokens=k)
    for i, (p, s) in enumerate(zip(plain, spec)):
        assert [o.token_ids for o in s.outputs] == [o.token_ids for o in p.outputs], f"request {i} diverged"
        assert [o.finish_reason for o in s.outputs] == [o.finish_reason for o in p.outputs], i
    stats = llm.engine.stats()["speculative"]
    assert stats["proposed_tokens"] > 0 and stats["accepted_tokens"] > 0, stats
    # n = 3 greedy: three identical samples, each carried through forks and speculation
    forked = [o.token_ids for o in spec[1].outputs]
    assert len(forked) == 3 and forked[0] == forked[1] == forked[2]
    # logprobs: one entry per token, the sampled token is the most likely (greedy, no penalties)
    out = spec[2].outputs[0]
    assert len(out.logprobs) == len(out.token_ids)
    assert all(lp.token_id == t and lp.top[0][0] == t for lp, t in zip(out.logprobs, out.token_ids))
    # the grammar holds even with speculating neighbours (it finishes, or runs out of tokens)
    grammar = spec[3].outputs[0]
    if grammar.finish_reason.value == "stop":
        assert isinstance(json.loads(grammar.text), dict)
    # every block back in the pool once the batch is done (shared, speculated, rolled back)
    llm.engine.step()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
