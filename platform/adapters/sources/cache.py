"""The local disk cache of fetched adapters: ``<root>/<sha256>/`` per content, LRU within a byte
budget. An entry is written into a staging folder and renamed into place, so a crash never leaves
a half-written entry under its address; leftovers of a crash are swept at start."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from loraplex.platform.errors import ServiceUnavailable

log = logging.getLogger("loraplex.platform.adapters")

_HEX = set("0123456789abcdef")


def _is_sha(name: str) -> bool:
    return len(name) == 64 and set(name) <= _HEX


class DiskCache:
    def __init__(
        self,
        root: Path,
        max_bytes: int,
        on_evict: Callable[[str], None] | None = None,
        pinned: Callable[[], set[str]] | None = None,
        release: Callable[[str], bool] | None = None,
    ) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.on_evict = on_evict  # told the sha of each evicted entry (the engine drops it)
        # Entries the engine may still read are never removed under it; the budget may be exceeded
        # while everything beyond it is in use. ``pinned``: a snapshot taken before an eviction
        # pass (requests queued or running); ``release``: asked under this cache's lock, so an
        # admission racing the eviction either pins the entry first or finds it gone and refetches.
        self.pinned = pinned
        self.release = release
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, int] = OrderedDict()  # sha -> bytes, least recently used first
        self.counters = {"hits": 0, "misses": 0, "evictions": 0, "stored": 0}
        self._scan()

    def _scan(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.staging_root, ignore_errors=True)
        found = []
        for entry in self.root.iterdir():
            if entry.is_dir() and _is_sha(entry.name):
                size = sum(p.stat().st_size for p in entry.iterdir() if p.is_file())
                found.append((entry.stat().st_mtime, entry.name, size))
        for _, sha, size in sorted(found):
            self._entries[sha] = size
        self._evict_to_budget(keep=None)

    @property
    def staging_root(self) -> Path:
        return self.root / ".staging"

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, sha: str) -> bool:
        with self._lock:
            return sha in self._entries

    @contextmanager
    def staging(self) -> Iterator[Path]:
        self.staging_root.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(dir=self.staging_root))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def get(self, sha: str) -> Path | None:
        """The entry's folder (now most recently used), or None."""
        with self._lock:
            if sha not in self._entries or not (self.root / sha).is_dir():
                self._entries.pop(sha, None)
                self.counters["misses"] += 1
                return None
            self._entries.move_to_end(sha)
            self.counters["hits"] += 1
            return self.root / sha

    def put(self, staged: Path, sha: str) -> Path:
        """Move ``staged`` in as ``sha``; evict least recently used entries beyond the budget."""
        size = sum(p.stat().st_size for p in staged.iterdir() if p.is_file())
        if size > self.max_bytes:
            raise ServiceUnavailable(
                f"the adapter ({size} bytes) is larger than the whole disk cache ([adapters] cache_max_bytes"
                f" = {self.max_bytes})",
                code="model_unavailable",
            )
        final = self.root / sha
        with self._lock:
            if not final.is_dir():
                staged.rename(final)
                self.counters["stored"] += 1
            self._entries[sha] = size
            self._entries.move_to_end(sha)
        self._evict_to_budget(keep=sha)
        return final

    def _evict_to_budget(self, keep: str | None) -> None:
        evicted = []
        with self._lock:
            total = sum(self._entries.values())
        pinned = self.pinned() if self.pinned is not None and total > self.max_bytes else set()
        with self._lock:
            total = sum(self._entries.values())
            for sha in list(self._entries):
                if total <= self.max_bytes:
                    break
                if sha == keep or sha in pinned or (self.release is not None and not self.release(sha)):
                    continue
                total -= self._entries.pop(sha)
                shutil.rmtree(self.root / sha, ignore_errors=True)
                self.counters["evictions"] += 1
                evicted.append(sha)
        for sha in evicted:
            log.info("adapter cache: evicted %s", sha[:12])
            if self.on_evict is not None:
                self.on_evict(sha)

    def stats(self) -> dict:
        with self._lock:
            return {
                "entries": len(self._entries),
                "used_bytes": sum(self._entries.values()),
                "max_bytes": self.max_bytes,
                **self.counters,
            }
