"""``AdapterResolver``: an adapter reference → a validated local folder, through the disk cache.

Every engine (the single process, each Ray replica) resolves adapters itself, so no shared
filesystem is needed. A reference names the source and the content hash it was registered with:
a cached copy of that content is used without asking the store (a store that is down does not stop
cached adapters); otherwise the files are listed, checked with the upload's rules, downloaded once
(concurrent callers share one download), hashed, and cached. A caller waits at most
``fetch_timeout_s``; the download itself goes on (until ``fetch_deadline_s``) and the next request
finds it cached. Fetches run in per-store lanes (``lanes.py``), never on a caller's thread, and
nothing here touches the database: callers resolve what they need from it first and release
their connection before they wait on a store.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.platform.adapters.sources.cache import DiskCache
from loraplex.platform.adapters.sources.fetchers import Fetcher, HubFetcher, StoreUnavailable
from loraplex.platform.adapters.sources.lanes import StoreLanes
from loraplex.platform.adapters.sources.local import FileFetcher
from loraplex.platform.adapters.sources.s3 import S3Fetcher
from loraplex.platform.adapters.sources.uri import (
    AdapterReference,
    RemoteFile,
    SourceURI,
    check_files,
    parse_source,
)
from loraplex.platform.adapters.store import AdapterStore

if TYPE_CHECKING:
    from loraplex.platform.settings import Settings

log = logging.getLogger("loraplex.platform.adapters")

DEFAULT_FILE_ROOT = "adapter-files"  # file:// sources without [adapters] file_roots: <data_dir>/adapter-files


@dataclass(frozen=True)
class Fetched:
    path: Path  # the cached folder (adapter_config.json + adapter_model.safetensors)
    sha256: str  # content hash (the same as an upload of the same files)
    fingerprint: str  # the store's change tags of the listed files
    size_bytes: int
    downloaded: bool  # False: served from the disk cache


def cache_root(settings: Settings) -> Path:
    """The configured disk cache of fetched adapters (``[adapters] cache_dir``, else in data_dir)."""
    a = settings.adapters
    return Path(a.cache_dir) if a.cache_dir else settings.data_dir / "adapter-cache"


def default_file_root(data_dir: Path) -> Path:
    """Where file:// sources must lie when ``[adapters] file_roots`` is empty (created here)."""
    root = Path(data_dir) / DEFAULT_FILE_ROOT
    root.mkdir(parents=True, exist_ok=True)
    return root


def fingerprint_of(files: list[RemoteFile]) -> str:
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.name):
        digest.update(f"{f.name}\0{f.size}\0{f.etag}\n".encode())
    return digest.hexdigest()


class AdapterResolver:
    def __init__(
        self,
        cache: DiskCache,
        fetchers: dict[str, Fetcher],
        *,
        max_members: int,
        max_bytes: int,
        fetch_timeout_s: float,
        fetch_deadline_s: float | None = None,
        per_store: int = 2,
        queued_per_store: int = 8,
        max_threads: int = 16,
    ) -> None:
        self.cache = cache
        self.fetchers = fetchers
        self.max_members = max_members
        self.max_bytes = max_bytes
        self.fetch_timeout_s = fetch_timeout_s  # how long a caller waits
        self.fetch_deadline_s = fetch_deadline_s or 6 * fetch_timeout_s  # how long a fetch may run
        self.lanes: StoreLanes[Fetched] = StoreLanes(per_store, queued_per_store, max_threads)
        self.counters = {"downloads": 0, "download_bytes": 0, "cache_hits": 0, "failures": 0}

    @classmethod
    def from_settings(
        cls, settings: Settings, on_evict: Callable[[str], None] | None = None, cache_dir: Path | None = None
    ) -> AdapterResolver:
        """``cache_dir``: this resolver's own disk cache (an engine replica's), instead of the
        configured one."""
        a = settings.adapters
        cache = DiskCache(cache_dir or cache_root(settings), a.cache_max_bytes)
        cache.on_evict = on_evict
        fetchers: dict[str, Fetcher] = {
            "s3": S3Fetcher(a.s3_endpoint_url, a.s3_region, a.connect_timeout_s, a.read_timeout_s, a.s3_max_attempts),
            "file": FileFetcher(a.file_roots or [str(default_file_root(settings.data_dir))]),
            "hf": HubFetcher(a.hf_cache_dir, a.hf_offline),
        }
        u = settings.uploads
        return cls(
            cache,
            fetchers,
            max_members=u.max_members,
            max_bytes=u.max_unpacked_bytes,
            fetch_timeout_s=a.fetch_timeout_s,
            fetch_deadline_s=a.fetch_deadline_s,
            per_store=a.fetches_per_store,
            queued_per_store=a.fetch_queue_per_store,
            max_threads=a.fetch_threads,
        )

    # -- the one call replicas and the serving path make ----------------------------------------
    def local_dir(self, ref: AdapterReference) -> Path:
        """A local folder holding ``ref``'s registered content: from the disk cache, or fetched
        (and refused if the store now holds other content)."""
        fetched = self.fetch(ref.source, expected_sha256=ref.sha256)
        if fetched.sha256 != ref.sha256:
            raise ContentChanged(ref.source, ref.sha256, fetched)
        return fetched.path

    def fetch(self, source: str, *, expected_sha256: str | None = None) -> Fetched:
        """Resolve ``source``, blocking this thread at most ``fetch_timeout_s`` (then
        ``StoreUnavailable``); with ``expected_sha256`` a cached copy of that content is used
        without asking the store. Never call it holding a database connection."""
        fut = self.fetch_future(source, expected_sha256=expected_sha256)
        try:
            return fut.result(timeout=self.fetch_timeout_s)
        except FutureTimeout:
            raise self.too_slow(source) from None

    async def fetch_async(self, source: str, *, expected_sha256: str | None = None) -> Fetched:
        """``fetch`` for the event loop: the wait holds no thread (the fetch runs in its lane)."""
        fut = asyncio.wrap_future(self.fetch_future(source, expected_sha256=expected_sha256))
        fut.add_done_callback(_retrieve)  # a caller that gave up leaves no "never retrieved" error
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.fetch_timeout_s)
        except asyncio.TimeoutError:
            raise self.too_slow(source) from None

    def fetch_future(self, source: str, *, expected_sha256: str | None = None) -> Future[Fetched]:
        """A future of the fetch: done at once for a cached copy; otherwise the fetch of this
        source (shared with every concurrent caller), in its store's lane (``StoreBusy`` if full)."""
        src = parse_source(source)
        if expected_sha256:
            cached = self.cache.get(expected_sha256)
            if cached is not None:
                self.counters["cache_hits"] += 1
                done: Future[Fetched] = Future()
                done.set_result(Fetched(cached, expected_sha256, "", _size(cached), downloaded=False))
                return done
        fetcher = self.fetchers[src.scheme]
        store = fetcher.store_key(src) if hasattr(fetcher, "store_key") else src.scheme
        return self.lanes.submit(store, (str(src), expected_sha256), partial(self._fetch_now, src))

    def too_slow(self, source: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"fetching {source} took longer than {self.fetch_timeout_s:g}s (the store is slow or down); "
            "the download goes on, try again shortly",
            headers={"retry-after": "10"},
        )

    def _fetch_now(self, src: SourceURI) -> Fetched:
        deadline = time.monotonic() + self.fetch_deadline_s
        try:
            fetcher = self.fetchers[src.scheme]
            listed = check_files(
                fetcher.list(src, deadline), max_members=self.max_members, max_bytes=self.max_bytes, where=str(src)
            )
            with self.cache.staging() as scratch:
                files = scratch / "files"
                files.mkdir()
                for f in listed:
                    fetcher.download(src, f, files / f.name, deadline)
                sha = AdapterStore.content_hash(files)
                size = _size(files)
                if sha in self.cache:  # the same content cached under another source: keep one copy
                    path = self.cache.get(sha) or self.cache.put(files, sha)
                else:
                    path = self.cache.put(files, sha)
        except Exception:
            self.counters["failures"] += 1
            raise
        self.counters["downloads"] += 1
        self.counters["download_bytes"] += size
        log.info("fetched adapter %s (%d bytes, sha256 %s)", src, size, sha[:12])
        return Fetched(path, sha, fingerprint_of(listed), size, downloaded=True)

    def stats(self) -> dict:
        lanes = self.lanes.stats()
        return {**self.counters, "joined": lanes["joined"], "lanes": lanes, "disk_cache": self.cache.stats()}

    def close(self) -> None:
        self.lanes.close()
        for fetcher in self.fetchers.values():
            if hasattr(fetcher, "close"):
                fetcher.close()


class ContentChanged(StoreUnavailable):
    """The store now holds different content than the version that was registered."""

    code = "model_unavailable"

    def __init__(self, source: str, expected: str, fetched: Fetched) -> None:
        super().__init__(
            f"{source} changed since it was registered (sha256 {expected[:12]} -> {fetched.sha256[:12]}); "
            "it is registered as a new version"
        )
        self.fetched = fetched


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
