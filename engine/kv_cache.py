"""Paged KV cache bookkeeping: a pool of fixed-size blocks with refcounts, and per-sequence block
tables. The tensors themselves live in the model runner; this module only hands out block ids.

The scheduler talks to ``KVCacheManager`` only (never to the pool), so the block-sharing rules
(prefix caching, copy-on-write) stay behind one seam.
"""
from __future__ import annotations

from collections import deque

from .sequence import Sequence


class BlockPool:
    """Block ids 0..num_blocks-1 with reference counts. A block is free iff its refcount is 0."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.refcounts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("KV block pool exhausted (the scheduler should have checked)")
        block = self._free.popleft()
        assert self.refcounts[block] == 0
        self.refcounts[block] = 1
        return block

    def incref(self, block: int) -> None:
        assert self.refcounts[block] > 0, f"incref of free block {block}"
        self.refcounts[block] += 1

    def decref(self, block: int) -> None:
        assert self.refcounts[block] > 0, f"double free of block {block}"
        self.refcounts[block] -= 1
        if self.refcounts[block] == 0:
            self._free.append(block)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01):
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.watermark_blocks = int(watermark * num_blocks)
        self.block_tables: dict[int, list[int]] = {}

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

    def num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        have = len(self.block_tables.get(seq.seq_id, ()))
        return max(0, self.blocks_for_tokens(seq.num_computed_tokens + num_new_tokens) - have)

    def can_admit(self, seq: Sequence, num_new_tokens: int) -> bool:
        """A WAITING sequence may start only if the watermark stays free afterwards."""
        return self.pool.num_free - self.num_new_blocks(seq, num_new_tokens) >= self.watermark_blocks

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """A RUNNING sequence may dip into the watermark headroom."""
        return self.num_new_blocks(seq, num_new_tokens) <= self.pool.num_free

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        table = self.block_tables.setdefault(seq.seq_id, [])
        for _ in range(self.num_new_blocks(seq, num_new_tokens)):
            table.append(self.pool.allocate())

    def free(self, seq: Sequence) -> None:
        for block in reversed(self.block_tables.pop(seq.seq_id, [])):
            self.pool.decref(block)

    def block_table(self, seq: Sequence) -> list[int]:
        return self.block_tables.get(seq.seq_id, [])

    def slot(self, seq: Sequence, position: int) -> int:
        table = self.block_tables[seq.seq_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def stats(self) -> dict:
        used = self.pool.num_blocks - self.pool.num_free
        return {
            "num_blocks": self.pool.num_blocks,
            "block_size": self.block_size,
            "used_blocks": used,
            "free_blocks": self.pool.num_free,
            "usage": used / self.pool.num_blocks,
        }
