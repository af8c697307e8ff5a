"""Static batching is only a baseline, but it must still produce the same tokens."""

from __future__ import annotations

from loraplex.engine import LLM, SamplingParams


def test_static_and_continuous_agree_and_static_waits_for_batch(tiny_llama):
    prompts = [[5 + i] * (3 + 2 * i) for i in range(6)]
    params = [SamplingParams(max_tokens=2 + 5 * (i % 3), temperature=0.0, ignore_eos=True) for i in range(6)]
    cont = LLM(model=tiny_llama, max_num_seqs=3, block_size=8, num_kv_blocks=64)
    static = LLM(model=tiny_llama, max_num_seqs=3, block_size=8, num_kv_blocks=64, batching="static")
    a = cont.generate(prompts, params)
    b = static.generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    # Static: the 4th request cannot start before the whole first batch (longest: 12 tokens) ended,
    # while continuous batching starts it as soon as the first short request leaves.
    assert b[3].metrics["first_token_time"] >= max(o.metrics["finish_time"] for o in b[:3])
    assert a[3].metrics["first_token_time"] < max(o.metrics["finish_time"] for o in a[:3])
    assert cont.engine.counters["steps"] < static.engine.counters["steps"]
