"""Unit tests of the KV cache manager's prefix-cache rules: eviction order, hash keys, duplicates."""

from __future__ import annotations

from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.prefix_cache import ROOT_HASH, extra_key, hash_block
from loraplex.engine.sampling_params import SamplingParams
from loraplex.engine.sequence import AdapterRef, Request, Sequence

BS = 4


def make_seq(tokens, adapter=None, salt=None, sha="v1") -> Sequence:
    ref = AdapterRef(adapter, 1, sha) if adapter is not None else None
    req = Request("r", list(tokens), SamplingParams(), adapter=ref, cache_salt=salt)
    return Sequence(request=req, index=0, token_ids=list(tokens), num_prompt_tokens=len(tokens))


def prefill(kv: KVCacheManager, seq: Sequence) -> int:
    """Admit ``seq`` and compute its whole prompt in one chunk; returns the cached tokens used."""
    cached = kv.cached_prefix_len(seq)
    n = seq.num_tokens - cached
    assert kv.can_admit(seq, n, cached)
    kv.claim_cached_prefix(seq, cached)
    seq.num_computed_tokens = cached
    kv.allocate(seq, n)
    seq.num_computed_tokens += n
    kv.cache_computed_blocks(seq)
    return cached


def test_hash_keys_separate_adapters_salts_and_parents():
    toks = [1, 2, 3, 4]
    base = hash_block(ROOT_HASH, extra_key(None, None), toks)
    assert base == hash_block(ROOT_HASH, extra_key(None, None), toks)  # stable
    others = [
        hash_block(ROOT_HASH, extra_key("a", None), toks),
        hash_block(ROOT_HASH, extra_key(None, "a"), toks),
        hash_block(ROOT_HASH, extra_key("", None), toks),
        hash_block(ROOT_HASH, extra_key("a|b", None), toks),
        hash_block(ROOT_HASH, extra_key("a", "b"), toks),
        hash_block(base, extra_key(None, None), toks),
        hash_block(ROOT_HASH, extra_key(None, None), [1, 2, 3, 5]),
    ]
    assert len({base, *others}) == 1 + len(others)


def test_hits_need_full_computed_blocks_and_leave_the_last_token():
    kv = KVCacheManager(16, BS, 0.0, enable_prefix_caching=True)
    a = make_seq(range(10))
    assert prefill(kv, a) == 0
    assert kv.stats()["cached_blocks"] == 2  # the partial third block is not cached
    assert kv.cached_prefix_len(make_seq(range(8))) == 4  # never the last token: block 2 recomputed
    assert kv.cached_prefix_len(make_seq(range(9))) == 8
    assert kv.cached_prefix_len(make_seq(range(12))) == 8
    assert kv.cached_prefix_len(make_seq([0, 1, 2, 9, 4, 5, 6, 7, 8])) == 0
    assert kv.cached_prefix_len(make_seq(range(9), salt="x")) == 0
    assert kv.cached_prefix_len(make_seq(range(9), adapter="lora")) == 0
    assert kv.cached_prefix_len(make_seq(range(9), adapter="lora", sha="v2")) == 0


def test_caching_off_registers_nothing():
    kv = KVCacheManager(8, BS, 0.0)
    prefill(kv, make_seq(range(9)))
    assert kv.stats()["cached_blocks"] == 0 and kv.cached_prefix_len(make_seq(range(9))) == 0


def test_free_list_prefers_never_cached_then_least_recently_used():
    kv = KVCacheManager(6, BS, 0.0, enable_prefix_caching=True)
    old, new = make_seq(range(100, 105)), make_seq(range(200, 205))  # one full block + 1 token each
    prefill(kv, old)
    prefill(kv, new)
    old_block, new_block = kv.block_table(old)[0], kv.block_table(new)[0]
    kv.free(old)
    kv.free(new)
    assert kv.stats()["evictable_blocks"] == 2 and kv.num_free_blocks == 6
    # 4 plain blocks are handed out before any cached one is evicted...
    filler = make_seq(range(16))
    kv.allocate(filler, 16)
    assert old_block not in kv.block_table(filler) and new_block not in kv.block_table(filler)
    # ...then the least recently freed cached block goes first.
    more = make_seq(range(4))
    kv.allocate(more, 4)
    assert kv.block_table(more) == [old_block]
    assert kv.cached_prefix_len(make_seq(range(100, 105))) == 0
    assert kv.cached_prefix_len(make_seq(range(200, 205))) == 4
    assert kv.stats()["prefix_cache_evictions"] == 1


def test_a_hit_revives_a_free_cached_block_and_refreshes_its_recency():
    kv = KVCacheManager(4, BS, 0.0, enable_prefix_caching=True)
    a, b = make_seq(range(5)), make_seq(range(50, 55))
    prefill(kv, a)
    prefill(kv, b)
    kv.free(a)
    kv.free(b)
    again = make_seq(range(6))
    assert kv.num_new_blocks(again, 2, 4) == 2  # the revived block counts against the free pool
    assert prefill(kv, again) == 4
    kv.free(again)  # a's block is now the most recently used
    hog = make_seq(range(300, 316))
    kv.allocate(hog, 12)  # 3 blocks: 2 plain + the LRU cached one (b's)
    assert kv.cached_prefix_len(make_seq(range(5))) == 4
    assert kv.cached_prefix_len(make_seq(range(50, 55))) == 0


def test_tail_of_a_chain_is_evicted_before_its_head():
    kv = KVCacheManager(3, BS, 0.0, enable_prefix_caching=True)
    a = make_seq(range(12))  # 3 full blocks; the last one is not cached (its last token)...
    prefill(kv, a)
    a.token_ids.append(99)
    kv.cache_computed_blocks(a)
    kv.free(a)
    assert kv.stats()["evictable_blocks"] == 3
    kv.allocate(make_seq(range(4)), 4)
    assert kv.cached_prefix_len(make_seq(range(13))) == 8  # the head survives


def test_duplicate_content_stays_unregistered_and_frees_plain():
    kv = KVCacheManager(8, BS, 0.0, enable_prefix_caching=True)
    a, b = make_seq(range(9)), make_seq(range(9))
    for s in (a, b):  # both admitted before either computed: no hit, two copies of the KV
        kv.claim_cached_prefix(s, kv.cached_prefix_len(s))
        kv.allocate(s, 9)
    for s in (a, b):
        s.num_computed_tokens = 9
        kv.cache_computed_blocks(s)
    assert kv.stats()["cached_blocks"] == 2
    kv.free(b)
    assert kv.stats()["evictable_blocks"] == 0  # b's duplicates went back as plain blocks
    kv.free(a)
    assert kv.stats()["evictable_blocks"] == 2 and kv.num_free_blocks == 8


def test_fork_shares_and_copy_on_write_copies_only_the_written_block():
    kv = KVCacheManager(10, BS, 0.0, enable_prefix_caching=True)
    parent = make_seq(range(6))
    prefill(kv, parent)
    children = [make_seq(range(6)) for _ in range(3)]
    for c in children:
        kv.fork(parent, c)
        c.num_computed_tokens = 6
    assert kv.stats()["used_blocks"] == 2
    for s in [parent, *children]:
        s.token_ids.append(7)
    assert kv.num_new_blocks(parent, 1) == 1 and kv.can_append(parent, 1)
    for s in [parent, *children]:
        kv.allocate(s, 1)
    copies = kv.take_block_copies()
    assert len(copies) == 3 and kv.take_block_copies() == []
    shared_tail = copies[0][0]
    assert all(src == shared_tail for src, _ in copies)
    assert kv.num_new_blocks(children[-1], 1) == 0  # the last holder writes in place
    assert kv.stats()["used_blocks"] == 1 + 4
    assert len({kv.block_table(s)[0] for s in [parent, *children]}) == 1
    for s in [parent, *children]:
        kv.free(s)
    assert kv.num_free_blocks == 10


def test_watermark_blocks_admission_not_appends():
    kv = KVCacheManager(10, BS, 0.2)
    hog = make_seq(range(28))
    assert kv.can_admit(hog, 28)  # 7 blocks, 3 left >= 2
    kv.allocate(hog, 28)
    assert not kv.can_admit(make_seq(range(8)), 8)  # would leave 1 < 2
    hog.num_computed_tokens = 28
    assert kv.can_append(hog, 8)  # running sequences may dip into the headroom


def test_headroom_budget_never_promises_the_watermark_or_a_block_twice():
    """The manager's budgets (static batch, speculative lookahead) count against the same free
    blocks above the watermark; an oracle count by hand: 20 blocks, watermark 2 -> 18 to promise."""
    kv = KVCacheManager(20, BS, watermark=0.1)
    assert kv.watermark_blocks == 2
    room = kv.headroom()
    assert room.take_tokens(10 * BS)  # 10 blocks
    assert not room.take_tokens(9 * BS)  # 9 > the 8 left: refused, nothing taken
    assert room.take_tokens(8 * BS) and not room.take_tokens(1)
    seq = make_seq([1, 2, 3, 4, 5])  # 5 tokens in 2 blocks: positions 5-7 still fit the second
    kv.allocate(seq, 5)
    seq.num_computed_tokens = 5
    room = kv.headroom()  # 18 free - 2 = 16
    assert room.take_lookahead(seq, 2)  # the next token (5) + 2 drafts (6, 7): no new block
    assert room.blocks == 16
    assert room.take_lookahead(seq, 3) and room.blocks == 15  # a draft at 8 opens block 3
    room = kv.headroom()
    assert room.take_lookahead(seq, 2 + 4 * 16)  # 16 more blocks: exactly the headroom
    assert room.blocks == 0 and not room.take_lookahead(seq, 3)
    assert kv.admission_shortfall(make_seq(list(range(80))), 80) == 20 + 2 - 18  # blocks + watermark - free
    assert kv.blocks_held(seq) == 2 and kv.can_ever_hold(18 * BS) and not kv.can_ever_hold(18 * BS + 1)
