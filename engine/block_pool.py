"""The KV block pool: ids, reference counts, and the free lists (plain, and cached LRU).

Only ``KVCacheManager`` (kv_cache.py) talks to it: the scheduler sees the manager's answers, never
a refcount (vLLM v1 keeps the same split: ``block_pool.py`` under ``kv_cache_manager.py``).
"""

from __future__ import annotations

from collections import OrderedDict, deque


class BlockPool:
    """Block ids 0..num_blocks-1 with reference counts. A block is free iff its refcount is 0.

    Free blocks come in two kinds: plain ones (never cached, or whose hash was not registered) and
    cached ones, still holding reusable KV. Allocation takes plain blocks first, then evicts the
    least recently freed cached block, so the prefix cache keeps what was used last.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.refcounts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # hash -> block holding that KV
        self._free: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._free_cached)

    @property
    def num_cached(self) -> int:
        return len(self.cached)

    @property
    def num_evictable(self) -> int:
        """Free blocks that still hold cached KV."""
        return len(self._free_cached)

    def allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._free_cached:
            block, _ = self._free_cached.popitem(last=False)
            old_hash = self.block_hash[block]
            assert old_hash is not None  # blocks in _free_cached always carry their hash
            del self.cached[old_hash]
            self.block_hash[block] = None
            self.num_evictions += 1
        else:
            raise RuntimeError("KV block pool exhausted (the scheduler should have checked)")
        assert self.refcounts[block] == 0
        self.refcounts[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.refcounts[block] == 0:
            # Only a cached block may be revived from the free list (a prefix-cache hit).
            assert self.block_hash[block] is not None, f"incref of free block {block}"
            del self._free_cached[block]
        self.refcounts[block] += 1

    def decref(self, block: int) -> None:
        assert self.refcounts[block] > 0, f"double free of block {block}"
        self.refcounts[block] -= 1
        if self.refcounts[block] == 0:
            if self.block_hash[block] is None:
                self._free.append(block)
            else:
                self._free_cached[block] = None  # most recently used end

    def lookup(self, block_hash: bytes) -> int | None:
        return self.cached.get(block_hash)

    def register(self, block: int, block_hash: bytes) -> bool:
        """Record that ``block`` (full, KV computed) holds ``block_hash``. A second block with the
        same content (two requests prefilled the same prefix at once) stays unregistered."""
        if self.block_hash[block] is not None or block_hash in self.cached:
            return False
        self.block_hash[block] = block_hash
        self.cached[block_hash] = block
        return True

    def free_blocks(self) -> list[int]:
        return list(self._free) + list(self._free_cached)
