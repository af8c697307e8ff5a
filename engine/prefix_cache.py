"""Block hashing for automatic prefix caching.

A full block's identity is ``sha256(parent_hash, adapter_key, cache_salt, block_token_ids)``: the
parent chains it to everything before it, the adapter key keeps KV computed under one LoRA (which
may change k/v) away from every other adapter, and the salt (set per tenant by the platform) keeps
one tenant's cache hits from revealing another tenant's prompts.

Why sha256 and not Python's ``hash``: a collision would hand a request someone else's KV — wrong
output and a cross-tenant leak. The tuple hash of ints is 64-bit and trivially collidable on
purpose (``hash(-1) == hash(-2)``, ints hash mod 2**61-1), so a tenant could craft colliding prompts.
sha256 makes that infeasible; it costs ~1 µs per 16-token block, noise next to a forward pass.
The digest is also stable across processes, should the cache ever be shared or persisted.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

ROOT_HASH = b"\x00" * 32


def extra_key(adapter_key: str | None, cache_salt: str | None) -> bytes:
    """Length-prefixed so that (adapter "a|b", salt None) and (adapter "a", salt "b") differ, and a
    missing value differs from an empty string."""
    parts = []
    for value in (adapter_key, cache_salt):
        if value is None:
            parts.append(b"\x00")
        else:
            raw = value.encode("utf-8")
            parts.append(b"\x01" + len(raw).to_bytes(8, "little") + raw)
    return b"".join(parts)


def hash_block(parent: bytes, extra: bytes, token_ids: Sequence[int]) -> bytes:
    """Digest of one FULL block (every block has exactly block_size tokens, so the token bytes
    cannot be ambiguous); int64 covers every vocabulary."""
    h = hashlib.sha256(parent)
    h.update(len(extra).to_bytes(4, "little"))
    h.update(extra)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class SeqBlockHashes:
    """The chain of block hashes of one sequence's token ids, extended lazily. Token ids are only
    ever appended, so a computed prefix of the chain never goes stale."""

    __slots__ = ("extra", "hashes")

    def __init__(self, extra: bytes, hashes: list[bytes] | None = None):
        self.extra = extra
        self.hashes: list[bytes] = hashes or []

    def upto(self, token_ids: list[int], num_blocks: int, block_size: int) -> list[bytes]:
        hashes = self.hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else ROOT_HASH
            hashes.append(hash_block(parent, self.extra, token_ids[i * block_size : (i + 1) * block_size]))
        return hashes
