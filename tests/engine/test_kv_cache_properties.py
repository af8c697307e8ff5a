"""Property tests of the KV block pool: random interleavings of admit (with prefix-cache hits),
chunked prefill, decode appends, n>1 forks, speculative steps with rollback, preemption, finish
and abort.

Besides the bookkeeping invariants (refcounts = table references, free list = refcount-0 blocks,
hash map consistent, watermark at admission, everything free at the end) the machine simulates
the KV tensors: every "forward" writes, for each computed position, the identity of the KV it
would hold (adapter, salt, all tokens up to there). A sequence must then read exactly its own KV at
every computed position — a wrong prefix hit, a missed copy-on-write or a block reused while still
referenced shows up as a wrong identity.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.sampling_params import SamplingParams
from loraplex.engine.sequence import AdapterRef, Request, Sequence

BS = 2
TOKENS = st.integers(0, 2)  # a tiny alphabet: prefixes collide often, so hits are frequent


class KVMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(6, 24), watermark=st.sampled_from([0.0, 0.1, 0.2]), caching=st.booleans())
    def setup(self, num_blocks, watermark, caching):
        self.kv = KVCacheManager(num_blocks, BS, watermark, enable_prefix_caching=caching)
        self.content: dict[int, dict[int, tuple]] = {}  # block -> offset -> KV identity
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def identity(seq: Sequence, pos: int) -> tuple:
        return (seq.request.adapter, seq.request.cache_salt, tuple(seq.token_ids[: pos + 1]))

    def run_chunks(self, chunks: list[tuple[Sequence, int]]) -> None:
        """One engine step: copies first (the runner applies them before the forward), then writes,
        then computed blocks become cacheable."""
        for src, dst in self.kv.take_block_copies():
            self.content[dst] = dict(self.content.get(src, {}))
        for seq, n in chunks:
            table = self.kv.block_table(seq)
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                self.content.setdefault(table[pos // BS], {})[pos % BS] = self.identity(seq, pos)
        for seq, n in chunks:
            seq.num_computed_tokens += n
            self.kv.cache_computed_blocks(seq)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        self.waiting.append(seq)

    # ------------------------------------------------------------------ rules
    @rule(
        prompt=st.lists(TOKENS, min_size=1, max_size=9),
        adapter=st.sampled_from([None, "a", "b"]),
        salt=st.sampled_from([None, "t1", "t2"]),
    )
    def add(self, prompt, adapter, salt):
        req = Request(
            "r",
            list(prompt),
            SamplingParams(),
            adapter=AdapterRef(adapter, 1, "x") if adapter else None,
            cache_salt=salt,
        )
        self.waiting.append(Sequence(request=req, index=0, token_ids=list(prompt), num_prompt_tokens=len(prompt)))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), budget=st.integers(1, 8))
    def admit(self, data, budget):
        seq = data.draw(st.sampled_from(self.waiting))
        cached = self.kv.cached_prefix_len(seq)
        assert cached % BS == 0 and cached < seq.num_tokens
        n = min(seq.num_tokens - cached, budget)
        if not self.kv.can_admit(seq, n, cached):
            return
        self.waiting.remove(seq)
        self.kv.claim_cached_prefix(seq, cached)
        seq.num_computed_tokens = cached
        self.kv.allocate(seq, n)
        assert self.kv.num_free_blocks >= self.kv.watermark_blocks, "admission broke the watermark"
        self.running.append(seq)
        self.check_reads(seq)  # the cached prefix must already hold this sequence's own KV
        self.run_chunks([(seq, n)])

    @precondition(lambda self: self.running)
    @rule(data=st.data(), budget=st.integers(1, 8))
    def step(self, data, budget):
        """Continue some running sequences in one step (prefill chunks and decodes)."""
        picked = data.draw(st.lists(st.sampled_from(self.running), unique_by=id, min_size=1, max_size=4))
        chunks = []
        for seq in picked:
            if seq.num_computed_tokens == seq.num_tokens:  # decoded: "sample" a token first
                seq.token_ids.append(data.draw(TOKENS))
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self.kv.can_append(seq, n):
                self.preempt(seq)
                continue
            self.kv.allocate(seq, n)
            chunks.append((seq, n))
        self.run_chunks(chunks)

    @precondition(lambda self: any(s.num_computed_tokens == s.num_tokens for s in self.running))
    @rule(data=st.data(), k=st.integers(1, 3))
    def fork(self, data, k):
        """n > 1: children continue from a parent that has just computed all its tokens, each with
        its own next token."""
        parent = data.draw(st.sampled_from([s for s in self.running if s.num_computed_tokens == s.num_tokens]))
        for _ in range(k):
            child = Sequence(
                request=parent.request,
                index=1,
                token_ids=list(parent.token_ids),
                num_prompt_tokens=parent.num_prompt_tokens,
            )
            self.kv.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
            child.token_ids.append(data.draw(TOKENS))
            self.running.append(child)
        parent.token_ids.append(data.draw(TOKENS))

    @precondition(lambda self: any(s.num_computed_tokens >= s.num_tokens - 1 > 0 for s in self.running))
    @rule(data=st.data(), k=st.integers(1, 5))
    def speculate(self, data, k):
        """Speculative decoding: k drafts ride on a decode step (k+1 tokens computed), a random
        prefix of them is accepted, the rest is rolled back the way the engine does it: drafts
        leave token_ids, only the verified KV counts as computed, then blocks past it are freed."""
        seq = data.draw(st.sampled_from([s for s in self.running if s.num_computed_tokens >= s.num_tokens - 1 > 0]))
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(data.draw(TOKENS))
        base = seq.num_tokens
        drafts = data.draw(st.lists(TOKENS, min_size=k, max_size=k))
        seq.token_ids.extend(drafts)
        if not self.kv.can_append(seq, 1 + k):
            del seq.token_ids[base:]
            return
        self.kv.allocate(seq, 1 + k)
        for src, dst in self.kv.take_block_copies():  # copy-on-write of blocks shared with forks
            self.content[dst] = dict(self.content.get(src, {}))
        table = self.kv.block_table(seq)
        for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + 1 + k):
            self.content.setdefault(table[pos // BS], {})[pos % BS] = self.identity(seq, pos)
        accepted = data.draw(st.integers(0, k))
        del seq.token_ids[base:]
        seq.token_ids.extend(drafts[:accepted])
        seq.num_computed_tokens += 1 + accepted
        self.kv.cache_computed_blocks(seq)
        self.kv.truncate(seq, seq.num_computed_tokens)
        assert len(self.kv.block_table(seq)) == self.kv.blocks_for_tokens(seq.num_computed_tokens)
        seq.token_ids.append(data.draw(TOKENS))  # the target's correction / bonus token

    @precondition(lambda self: self.running or self.waiting)
    @rule(data=st.data())
    def finish_or_abort(self, data):
        seq = data.draw(st.sampled_from(self.running + self.waiting))
        (self.running if seq in self.running else self.waiting).remove(seq)
        self.kv.free(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt_one(self, data):
        self.preempt(data.draw(st.sampled_from(self.running)))

    # ------------------------------------------------------------------ invariants
    def check_reads(self, seq: Sequence) -> None:
        table = self.kv.block_table(seq)
        for pos in range(seq.num_computed_tokens):
            got = self.content.get(table[pos // BS], {}).get(pos % BS)
            assert got == self.identity(seq, pos), f"seq reads foreign KV at position {pos}"

    @invariant()
    def refcounts_match_tables(self):
        if not hasattr(self, "kv"):
            return
        pool = self.kv.pool
        refs = [0] * pool.num_blocks
        for table in self.kv.block_tables.values():
            for b in table:
                refs[b] += 1
        assert refs == pool.refcounts
        free = pool.free_blocks()
        assert len(free) == len(set(free)) == pool.num_free
        assert set(free) == {b for b in range(pool.num_blocks) if refs[b] == 0}
        for h, b in pool.cached.items():
            assert pool.block_hash[b] == h
        assert sum(h is not None for h in pool.block_hash) == len(pool.cached)
        assert set(pool._free_cached) == {b for b in free if pool.block_hash[b] is not None}
        assert set(self.kv.block_tables) <= {s.seq_id for s in self.running}, "a waiting sequence holds blocks"

    @invariant()
    def every_sequence_reads_its_own_kv(self):
        for seq in getattr(self, "running", []):
            self.check_reads(seq)

    @invariant()
    def registered_blocks_hold_what_their_hash_says(self):
        if not hasattr(self, "kv"):
            return
        for b in self.kv.pool.cached.values():
            assert len(self.content.get(b, {})) == BS, "a block was registered before it was full"

    def teardown(self):
        if not hasattr(self, "kv"):
            return
        for seq in self.running + self.waiting:
            self.kv.free(seq)
        assert self.kv.num_free_blocks == self.kv.num_blocks
        assert not self.kv.block_tables
        assert all(rc == 0 for rc in self.kv.pool.refcounts)


TestKVCacheProperties = pytest.mark.slow(KVMachine.TestCase)  # 300 examples x 40 steps: the whole suite
TestKVCacheProperties.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
