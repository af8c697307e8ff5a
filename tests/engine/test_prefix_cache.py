"""Prefix caching and copy-on-write forks, end to end through the engine.

The oracle is the same engine with prefix caching off: greedy outputs must be equal token for token.
"""

from __future__ import annotations

import random

import pytest

from loraplex.engine import LLM, SamplingParams

BS = 4
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def make_llm(model_dir: str, caching: bool, **kw) -> LLM:
    args = dict(
        dtype="float32",
        max_num_seqs=8,
        max_num_batched_tokens=64,
        block_size=BS,
        num_kv_blocks=96,
        kernel_backend="torch",
        enable_prefix_caching=caching,
    )
    args.update(kw)
    return LLM(model=model_dir, **args)


def rand_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(5, vocab) for _ in range(n)]


def run_all(llm: LLM, reqs) -> dict:
    """Step until every request in ``reqs`` finished; returns request_id -> final RequestOutput."""
    done = {}
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            if out.finished:
                done[out.request_id] = out
    return {r.request_id: done[r.request_id] for r in reqs}


def assert_pool_drained(llm: LLM) -> None:
    kv = llm.engine.kv
    assert kv.num_free_blocks == kv.num_blocks
    assert not kv.block_tables
    assert all(rc == 0 for rc in kv.pool.refcounts)


def shared_prefix_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = rand_tokens(rng, 22, vocab)  # 5.5 blocks: shared prefixes end mid-block
    prompts = [system + rand_tokens(rng, k, vocab) for k in (1, 2, 3, 6, 9, 14)]
    prompts.append(system[:20])  # exactly 5 blocks, all cached: the last block is recomputed
    prompts.append(system[:21])  # 5 full blocks + 1 token
    prompts.append(list(system))  # the whole system prompt
    prompts.append(system[:3])  # shorter than one block: nothing to share
    return prompts


@pytest.mark.parametrize("variant", ["llama_gqa", "mistral", pytest.param("qwen2_bias", marks=pytest.mark.slow)])
def test_outputs_with_caching_equal_without_mid_block_prefixes(model_factory, variant):
    results = {}
    for caching in (False, True):
        llm = make_llm(model_factory(variant), caching)
        prompts = shared_prefix_prompts(llm.engine.model_config.vocab_size)
        first = llm.generate(prompts[:1], GREEDY)  # warms the cache with the system prompt
        rest = llm.generate(prompts[1:], GREEDY)
        again = llm.generate(prompts, GREEDY)  # every prompt now fully cached (but its last token)
        results[caching] = [o.token_ids for o in first + rest + again]
        stats = llm.engine.stats()["kv_cache"]
        if caching:
            assert stats["prefix_cache_hits"] > 0 and 0 < stats["prefix_cache_hit_rate"] < 1
            assert again[0].metrics["num_cached_tokens"] == (len(prompts[0]) - 1) // BS * BS
            assert again[6].metrics["num_cached_tokens"] == 16  # 20 tokens: the last block is recomputed
            assert again[9].metrics["num_cached_tokens"] == 0
            assert stats["cached_blocks"] > 0 and stats["evictable_blocks"] == stats["cached_blocks"]
        else:
            assert stats["prefix_cache_hits"] == 0 and stats["cached_blocks"] == 0
        assert_pool_drained(llm)
    assert results[True] == results[False]


def test_request_arriving_while_prefix_is_prefilled_reads_only_computed_blocks(tiny_llama):
    outs = {}
    for caching in (False, True):
        llm = make_llm(tiny_llama, caching, max_num_batched_tokens=24)
        eng = llm.engine
        rng = random.Random(1)
        vocab = eng.model_config.vocab_size
        prompt_a = rand_tokens(rng, 40, vocab)
        prompt_b = prompt_a + rand_tokens(rng, 5, vocab)
        a = eng.add_request(prompt_a, GREEDY)
        eng.step()  # A is mid-prefill: 24 of 40 tokens computed (6 blocks)
        assert a.sequences[0].num_computed_tokens == 24
        b = eng.add_request(prompt_b, GREEDY)
        eng.step()  # A computes its last 16 tokens, B is admitted with the 8 tokens left
        seq_b = b.sequences[0]
        if caching:
            # A's blocks 6..9 were being computed in that very step: B must not have taken them.
            assert seq_b.num_cached_tokens == 24
            assert eng.kv.block_table(seq_b)[:6] == eng.kv.block_table(a.sequences[0])[:6]
            assert set(eng.kv.block_table(seq_b)[6:]).isdisjoint(eng.kv.block_table(a.sequences[0]))
        else:
            assert seq_b.num_cached_tokens == 0
        res = run_all(llm, [a, b])
        outs[caching] = [r.token_ids for r in res.values()]
        assert_pool_drained(llm)
    assert outs[True] == outs[False]


def _prefill_then(eng, prompt, **kw):
    req = eng.add_request(prompt, GREEDY, **kw)
    while req.sequences[0].num_output_tokens == 0:
        eng.step()
    return req


def test_salts_isolate_and_same_salt_shares_all_full_prefix_blocks(tiny_llama):
    llm = make_llm(tiny_llama, True)
    eng = llm.engine
    prompt = rand_tokens(random.Random(2), 30, eng.model_config.vocab_size)  # 7 full blocks + 2
    a = _prefill_then(eng, prompt, cache_salt="tenant-1")
    b = _prefill_then(eng, prompt, cache_salt="tenant-2")
    c = _prefill_then(eng, prompt, cache_salt="tenant-1")
    d = _prefill_then(eng, prompt)  # no salt is its own namespace too
    ta, tb, tc, td = (eng.kv.block_table(r.sequences[0]) for r in (a, b, c, d))
    assert set(ta).isdisjoint(tb) and set(ta).isdisjoint(td) and set(tb).isdisjoint(td)
    assert b.sequences[0].num_cached_tokens == 0 and d.sequences[0].num_cached_tokens == 0
    assert c.sequences[0].num_cached_tokens == 28
    assert tc[:7] == ta[:7] and set(tc[7:]).isdisjoint(ta)
    res = run_all(llm, [a, b, c, d])
    assert len({tuple(r.token_ids) for r in res.values()}) == 1  # same model, same prompt
    assert_pool_drained(llm)


def test_adapters_never_share_blocks(tiny_llama, tmp_path):
    from lora_testlib import make_peft_adapter

    llm = make_llm(tiny_llama, True)
    eng = llm.engine
    for i, name in enumerate(("kv_a", "kv_b")):
        llm.add_adapter(
            name,
            make_peft_adapter(
                tiny_llama, tmp_path / name, seed=i + 1, r=4, lora_alpha=8, target_modules=["k_proj", "v_proj"]
            ),
        )
    prompt = rand_tokens(random.Random(3), 26, eng.model_config.vocab_size)
    reqs = [_prefill_then(eng, prompt, adapter=ad) for ad in (None, "kv_a", "kv_b", "kv_a")]
    tables = [eng.kv.block_table(r.sequences[0]) for r in reqs]
    for i in range(3):
        for j in range(i + 1, 3):
            assert set(tables[i]).isdisjoint(tables[j])
    assert [r.sequences[0].num_cached_tokens for r in reqs] == [0, 0, 0, 24]
    assert tables[3][:6] == tables[1][:6]
    res = list(run_all(llm, reqs).values())
    assert res[1].token_ids == res[3].token_ids
    # Re-registering a name with other weights must not serve the old KV.
    llm.remove_adapter("kv_a")
    llm.add_adapter("kv_a", str(tmp_path / "kv_b"))
    e = _prefill_then(eng, prompt, adapter="kv_a")
    assert e.sequences[0].num_cached_tokens == 0  # the old kv_a KV is still cached, but not served
    assert res[2].token_ids == run_all(llm, [e])[e.request_id].token_ids
    assert_pool_drained(llm)


def test_preempted_sequences_rehit_their_own_blocks(tiny_llama):
    """A tight pool forces preemption; recomputation re-hits the victims' own cached blocks."""
    rng = random.Random(4)
    outs = {}
    for caching in (False, True):
        llm = make_llm(tiny_llama, caching, max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=24)
        vocab = llm.engine.model_config.vocab_size
        rng = random.Random(4)
        prompts = [rand_tokens(rng, L, vocab) for L in (13, 31, 40, 9, 24, 47, 17, 5)]
        res = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
        outs[caching] = [r.token_ids for r in res]
        assert llm.engine.counters["preemptions"] > 0
        if caching:  # distinct prompts: every hit is a preempted sequence re-hitting itself
            assert llm.engine.stats()["kv_cache"]["prefix_cache_hits"] > 0
        assert_pool_drained(llm)
    assert outs[True] == outs[False]


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("prompt_len", [18, 20])  # ends mid-block / on a block boundary
def test_n4_samples_share_prompt_blocks_and_release_all(tiny_llama, caching, prompt_len):
    llm = make_llm(tiny_llama, caching)
    eng = llm.engine
    prompt = rand_tokens(random.Random(5), prompt_len, eng.model_config.vocab_size)
    params = SamplingParams(n=4, max_tokens=10, temperature=1.0, seed=1234, ignore_eos=True)
    req = eng.add_request(prompt, params)
    eng.step()  # the whole prompt in one chunk; then the 3 followers fork from sample 0
    seqs = req.sequences
    assert all(s.num_output_tokens == 1 for s in seqs)
    tables = [eng.kv.block_table(s) for s in seqs]
    assert all(t == tables[0] for t in tables)  # prompt blocks held once
    prompt_blocks = eng.kv.blocks_for_tokens(prompt_len)
    assert eng.kv.stats()["used_blocks"] == prompt_blocks
    eng.step()  # every sample writes its first generated token: the partial block is copied
    full = prompt_len // BS
    for s in seqs:
        assert eng.kv.block_table(s)[:full] == tables[0][:full]
    tails = {eng.kv.block_table(s)[full] for s in seqs}
    assert len(tails) == 4  # one private last block each (3 copies + the original, or 4 fresh)
    assert eng.kv.stats()["used_blocks"] == full + 4
    out = run_all(llm, [req])[req.request_id]
    assert_pool_drained(llm)
    samples = [o.token_ids for o in out.outputs]
    assert len({tuple(s) for s in samples}) > 1
    # Sample i is what seed + i gives alone.
    solo = llm.generate(
        [prompt] * 4, [SamplingParams(max_tokens=10, temperature=1.0, seed=1234 + i, ignore_eos=True) for i in range(4)]
    )
    assert samples == [o.token_ids for o in solo]
    assert_pool_drained(llm)


def test_n4_greedy_equals_n1_and_abort_mid_prefill_releases_everything(tiny_llama):
    llm = make_llm(tiny_llama, True, max_num_batched_tokens=8)
    eng = llm.engine
    prompt = rand_tokens(random.Random(6), 23, eng.model_config.vocab_size)
    one = llm.generate([prompt], GREEDY)[0].token_ids
    four = llm.generate([prompt], SamplingParams(n=4, max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    assert [o.token_ids for o in four.outputs] == [one] * 4
    assert four.metrics["num_cached_tokens"] == 20
    req = eng.add_request(prompt + [7, 8, 9], SamplingParams(n=3, max_tokens=4))
    eng.step()  # the leader is mid-prefill; its followers wait
    out = eng.abort_request(req.request_id)
    assert out.finished and all(o.finish_reason == "abort" for o in out.outputs)
    assert_pool_drained(llm)
    assert not eng.scheduler.has_work()


def test_n_samples_with_early_stop_and_max_tokens_1(tiny_llama):
    llm = make_llm(tiny_llama, True)
    prompt = rand_tokens(random.Random(7), 9, llm.engine.model_config.vocab_size)
    out = llm.generate([prompt], SamplingParams(n=3, max_tokens=1, temperature=1.0, seed=3))[0]
    assert all(len(o.token_ids) == 1 and o.finish_reason == "length" for o in out.outputs)
    assert_pool_drained(llm)


def test_engine_stats_expose_cache(tiny_llama):
    llm = make_llm(tiny_llama, True)
    prompt = rand_tokens(random.Random(8), 17, llm.engine.model_config.vocab_size)
    llm.generate([prompt], GREEDY)
    out = llm.generate([prompt], GREEDY)[0]
    assert out.metrics["num_cached_tokens"] == 16
    kv = llm.engine.stats()["kv_cache"]
    for key in (
        "used_blocks",
        "free_blocks",
        "cached_blocks",
        "evictable_blocks",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "prefix_cache_hit_rate",
        "prefix_cache_evictions",
    ):
        assert key in kv
    assert kv["prefix_cache_queries"] == 34 and kv["prefix_cache_hits"] == 16
