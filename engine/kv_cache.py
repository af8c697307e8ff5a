"""Paged KV cache bookkeeping: a pool of fixed-size blocks with refcounts, per-sequence block tables,
automatic prefix caching and copy-on-write forks. The tensors live in the model runner; this module
only hands out block ids (and tells the runner which blocks to copy before a step).

The scheduler talks to ``KVCacheManager`` only (never to the pool), so the block-sharing rules stay
behind one seam:

* Prefix caching: once a block is FULL and its KV COMPUTED, its chain hash (see ``prefix_cache``)
  is registered. A new sequence takes the longest chain of registered blocks of its prefix and
  prefills only the rest — never its last token, whose logits must be computed. A registered block
  whose refcount drops to 0 stays in the pool, reusable, until it is evicted (LRU).
* Copy-on-write: ``fork`` shares every block of a parent (n > 1 samples share the prompt); the first
  write into a block held by more than one sequence allocates a fresh block and records a copy
  (``take_block_copies``) that the model runner applies before the forward.
* Accounting: a block is used while any table references it, so shared blocks count once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .block_pool import BlockPool
from .prefix_cache import SeqBlockHashes, extra_key
from .sequence import Sequence

if TYPE_CHECKING:
    import torch

    from .config import EngineConfig
    from .models import ModelConfig


def default_num_kv_blocks(config: EngineConfig, mcfg: ModelConfig, dtype: torch.dtype, max_model_len: int) -> int:
    """Blocks of ``config.kv_cache_memory_gb``, but never more than every sequence at full length."""
    from .memory import kv_bytes_per_token

    per_block = config.block_size * kv_bytes_per_token(mcfg, dtype)
    memory_gb = config.kv_cache_memory_gb
    assert memory_gb is not None, "EngineConfig sizes the KV memory when num_kv_blocks is unset"
    by_memory = int(memory_gb * (1 << 30) // per_block)
    assert config.max_num_seqs is not None, "EngineConfig sizes max_num_seqs at construction"
    by_need = config.max_num_seqs * -(-max_model_len // config.block_size) + 1
    return max(2, min(by_memory, by_need))


class BlockBudget:
    """Free blocks a pass may still promise (``KVCacheManager.headroom``): every block arithmetic
    of a plan that reserves ahead — the static batch's whole sequences, speculation's lookahead —
    goes through the manager, never through the caller's own sums."""

    def __init__(self, kv: KVCacheManager, blocks: int):
        self._kv = kv
        self.blocks = blocks

    def take_tokens(self, num_tokens: int) -> bool:
        """Reserve the blocks a sequence of ``num_tokens`` tokens holds; False (nothing taken) when short."""
        return self._take(self._kv.blocks_for_tokens(num_tokens))

    def take_lookahead(self, seq: Sequence, num_extra_tokens: int) -> bool:
        """Reserve what ``num_extra_tokens`` beyond ``seq``'s next token would add (speculative
        drafts): taken only from blocks free anyway, so speculation never causes a preemption."""
        kv = self._kv
        return self._take(kv.num_new_blocks(seq, 1 + num_extra_tokens) - kv.num_new_blocks(seq, 1))

    def _take(self, blocks: int) -> bool:
        if blocks > self.blocks:
            return False
        self.blocks -= blocks
        return True


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01, enable_prefix_caching: bool = False):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.watermark_blocks = int(watermark * num_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.block_tables: dict[int, list[int]] = {}
        self._hashes: dict[int, SeqBlockHashes] = {}
        self._num_registered: dict[int, int] = {}  # leading blocks of a table already offered to the cache
        self._copies: list[tuple[int, int]] = []  # (src, dst) copy-on-write copies for the next step
        self.query_tokens = 0
        self.hit_tokens = 0

    # ------------------------------------------------------------------ sizes
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def usable_blocks(self) -> int:
        """Blocks one sequence may ever hold: the whole pool minus the admission headroom."""
        return self.pool.num_blocks - self.watermark_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def max_tokens_per_sequence(self) -> int:
        """The longest sequence the pool can ever hold (all of it but the admission headroom)."""
        return self.usable_blocks * self.block_size

    def can_ever_hold(self, num_tokens: int) -> bool:
        return self.blocks_for_tokens(num_tokens) <= self.usable_blocks

    def headroom(self) -> BlockBudget:
        """The free blocks above the watermark, for a pass that reserves ahead (``BlockBudget``)."""
        return BlockBudget(self, self.pool.num_free - self.watermark_blocks)

    def admission_shortfall(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> int:
        """Blocks missing for ``can_admit`` to say yes (<= 0: it fits now)."""
        need = self.num_new_blocks(seq, num_new_tokens, num_cached_tokens) + self.watermark_blocks
        return need - self.pool.num_free

    def blocks_held(self, seq: Sequence) -> int:
        """Blocks in ``seq``'s table: at most what freeing it gives back (a shared block stays held)."""
        return len(self.block_tables.get(seq.seq_id, ()))

    # ------------------------------------------------------------------ prefix cache lookups
    def _seq_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        state = self._hashes.get(seq.seq_id)
        if state is None:
            # The engine keys an adapter by name + content hash: KV computed under one adapter, or
            # one version of it, is never reused under another.
            req = seq.request
            key = req.adapter.cache_key if req.adapter is not None else None
            state = self._hashes[seq.seq_id] = SeqBlockHashes(extra_key(key, req.cache_salt))
        return state.upto(seq.token_ids, num_blocks, self.block_size)

    def cached_prefix_len(self, seq: Sequence) -> int:
        """Tokens at the start of a WAITING ``seq`` whose KV the cache already holds: whole blocks,
        and never the last token (its logits must be computed). None for a request that asks for
        prompt logprobs: it needs the logits of every prompt position (vLLM bypasses it too)."""
        if not self.enable_prefix_caching or self.block_tables.get(seq.seq_id):
            return 0
        if seq.request.params.prompt_logprobs is not None:
            return 0
        hashes = self._seq_hashes(seq, (seq.num_tokens - 1) // self.block_size)
        hit = 0
        for h in hashes:
            if self.pool.lookup(h) is None:
                break
            hit += 1
        return hit * self.block_size

    def claim_cached_prefix(self, seq: Sequence, num_cached_tokens: int) -> None:
        """Admission: make the first ``num_cached_tokens`` (from ``cached_prefix_len`` in the same
        scheduling pass) the start of ``seq``'s block table. The caller sets num_computed_tokens."""
        if not self.enable_prefix_caching:
            return
        self.query_tokens += seq.num_tokens
        self.hit_tokens += num_cached_tokens
        if not num_cached_tokens:
            return
        assert not self.block_tables.get(seq.seq_id), "a running sequence cannot take a cached prefix"
        num = num_cached_tokens // self.block_size
        table = []
        for h in self._seq_hashes(seq, num)[:num]:
            block = self.pool.lookup(h)
            assert block is not None, "cached prefix vanished between lookup and claim"
            self.pool.incref(block)
            table.append(block)
        self.block_tables[seq.seq_id] = table
        self._num_registered[seq.seq_id] = num

    # ------------------------------------------------------------------ capacity checks
    def num_new_blocks(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> int:
        """Free blocks the next chunk takes from the pool: growth, copy-on-write copies, and cached
        blocks revived from the free list by a prefix hit."""
        bs = self.block_size
        if num_cached_tokens:
            hit = num_cached_tokens // bs
            revived = sum(1 for h in self._seq_hashes(seq, hit)[:hit] if self.pool.refcounts[self.pool.cached[h]] == 0)
            return revived + self.blocks_for_tokens(num_cached_tokens + num_new_tokens) - hit
        table = self.block_tables.get(seq.seq_id, ())
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens
        need = self.blocks_for_tokens(end)
        shared = sum(1 for i in range(start // bs, min(len(table), need)) if self.pool.refcounts[table[i]] > 1)
        return max(0, need - len(table)) + shared

    def can_admit(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        """A WAITING sequence may start only if the watermark stays free afterwards."""
        need = self.num_new_blocks(seq, num_new_tokens, num_cached_tokens)
        return self.pool.num_free - need >= self.watermark_blocks

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """A RUNNING sequence may dip into the watermark headroom."""
        return self.num_new_blocks(seq, num_new_tokens) <= self.pool.num_free

    # ------------------------------------------------------------------ table changes
    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make room for the next ``num_new_tokens`` of ``seq`` (from num_computed_tokens on)."""
        bs = self.block_size
        table = self.block_tables.setdefault(seq.seq_id, [])
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens
        need = self.blocks_for_tokens(end)
        for i in range(start // bs, min(len(table), need)):
            src = table[i]
            if self.pool.refcounts[src] > 1:
                # Registered blocks are full and computed, so no chunk ever writes into one.
                assert self.pool.block_hash[src] is None, "write into a cached block"
                dst = self.pool.allocate()
                self._copies.append((src, dst))
                self.pool.decref(src)
                table[i] = dst
        while len(table) < need:
            table.append(self.pool.allocate())

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` continues from ``parent``'s computed tokens, sharing every block (copy-on-write)."""
        assert not self.block_tables.get(child.seq_id)
        table = self.block_tables.get(parent.seq_id, [])
        for block in table:
            self.pool.incref(block)
        self.block_tables[child.seq_id] = list(table)
        self._num_registered[child.seq_id] = self._num_registered.get(parent.seq_id, 0)
        state = self._hashes.get(parent.seq_id)
        if state is not None:  # the shared computed prefix has the same chain
            shared = parent.num_computed_tokens // self.block_size
            self._hashes[child.seq_id] = SeqBlockHashes(state.extra, state.hashes[:shared])

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """After a step: register every block of ``seq`` that is now full with computed KV."""
        if not self.enable_prefix_caching:
            return
        table = self.block_tables.get(seq.seq_id)
        if not table:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(table))
        done = self._num_registered.get(seq.seq_id, 0)
        if full <= done:
            return
        hashes = self._seq_hashes(seq, full)
        for i in range(done, full):
            self.pool.register(table[i], hashes[i])
        self._num_registered[seq.seq_id] = full

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative decoding's rollback: keep the blocks of the first ``num_tokens`` positions and
        return the rest to the pool (tail first). Registered blocks are full and verified, so only
        blocks past ``num_tokens`` can go, and no hash ever covers an unverified token."""
        table = self.block_tables.get(seq.seq_id)
        if not table:
            return
        keep = self.blocks_for_tokens(num_tokens)
        while len(table) > keep:
            self.pool.decref(table.pop())
        full = num_tokens // self.block_size
        if self._num_registered.get(seq.seq_id, 0) > full:
            self._num_registered[seq.seq_id] = full
        state = self._hashes.get(seq.seq_id)
        if state is not None and len(state.hashes) > full:
            del state.hashes[full:]

    def free(self, seq: Sequence) -> None:
        # Tail first: within the LRU the end of a chain is evicted before its start, which other
        # prompts are more likely to share.
        for block in reversed(self.block_tables.pop(seq.seq_id, [])):
            self.pool.decref(block)
        self._hashes.pop(seq.seq_id, None)
        self._num_registered.pop(seq.seq_id, None)

    def take_block_copies(self) -> list[tuple[int, int]]:
        """(src, dst) block copies the runner must apply to every layer before the next forward."""
        copies, self._copies = self._copies, []
        return copies

    # ------------------------------------------------------------------ reads
    def block_table(self, seq: Sequence) -> list[int]:
        return self.block_tables.get(seq.seq_id, [])

    def slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat KV slots (block * block_size + offset) of positions ``start:end`` of ``seq``."""
        table, bs = self.block_tables[seq.seq_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def stats(self) -> dict:
        used = self.pool.num_blocks - self.pool.num_free
        return {
            "num_blocks": self.pool.num_blocks,
            "block_size": self.block_size,
            "used_blocks": used,
            "free_blocks": self.pool.num_free,
            "cached_blocks": self.pool.num_cached,  # blocks holding reusable KV (in use or free)
            "evictable_blocks": self.pool.num_evictable,  # free, but still holding cached KV
            "usage": used / self.pool.num_blocks,
            "prefix_caching": self.enable_prefix_caching,
            "prefix_cache_queries": self.query_tokens,  # tokens looked up on admission
            "prefix_cache_hits": self.hit_tokens,  # of those, tokens served from the cache
            "prefix_cache_hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
            "prefix_cache_evictions": self.pool.num_evictions,
        }
