"""HostCache: the adapters' converted weights in host memory, LRU, with background prefetch.

The middle tier (SGLang's ``mem_pool``-style split: the registry knows names, this holds bytes, the
device slots hold what a step reads). Up to ``max_cpu_loras`` copies, the least recently used one
that no request is waiting on evicted first. When a request is queued for an adapter that is not
here, its files are read and converted on a background thread (``load_adapter`` touches no shared
state) while the engine runs its current steps; the step that first needs it takes the finished
copy and waits only if the load is still running. Every read from disk checks the content hash the
registry recorded, so files swapped behind its back are refused, never served.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ..models.config import ModelConfig
from .loader import LoadedAdapter, load_adapter
from .registry import AdapterEntry, AdapterKey


class HostCache:
    def __init__(
        self,
        model_config: ModelConfig,
        max_cpu_loras: int,
        max_lora_rank: int,
        dtype: torch.dtype,
        device: torch.device,
        counters: dict[str, int],
    ):
        self.model_config = model_config
        self.max_cpu_loras = max_cpu_loras
        self.max_lora_rank = max_lora_rank
        self.dtype = dtype
        self.device = device  # where the slots live: pinned copies when it is a GPU
        self.counters = counters  # the LoRA manager's, shared by its tiers
        self._copies: OrderedDict[AdapterKey, LoadedAdapter] = OrderedDict()
        self._loading: dict[AdapterKey, Future[LoadedAdapter]] = {}
        self._prefetcher: ThreadPoolExecutor | None = None

    def read(self, path: str, expected_sha256: str | None = None) -> LoadedAdapter:
        """Read, validate and convert an adapter's files (no cache state touched: any thread)."""
        return load_adapter(path, self.model_config, self.max_lora_rank, self.dtype, expected_sha256=expected_sha256)

    def put(self, key: AdapterKey, loaded: LoadedAdapter, busy: set[AdapterKey]) -> None:
        """Keep ``loaded``; evict the least recently used copies no request needs (``busy``)."""
        self.counters["disk_loads"] += 1
        self._copies[key] = self._pinned(loaded)
        self._copies.move_to_end(key)
        while len(self._copies) > self.max_cpu_loras:
            victim = next((k for k in self._copies if k not in busy and k != key), next(iter(self._copies)))
            del self._copies[victim]
            self.counters["cpu_evictions"] += 1

    def get(self, e: AdapterEntry, busy: set[AdapterKey]) -> LoadedAdapter:
        """The host copy of ``e``: cached, prefetched, or read now."""
        loaded = self._copies.get(e.key)
        if loaded is not None:
            self._copies.move_to_end(e.key)
            self.counters["cpu_hits"] += 1
            return loaded
        fut = self._loading.pop(e.key, None)
        if fut is not None:
            self.counters["prefetch_ready" if fut.done() else "prefetch_waits"] += 1
            try:
                loaded = fut.result()
            except Exception:  # noqa: BLE001 - read again below, where the error surfaces
                loaded = None
        if loaded is None:
            # Re-read from disk; the content must still be the version that was registered.
            loaded = self.read(e.path, expected_sha256=e.info.sha256)
        self.put(e.key, loaded, busy)
        return loaded

    def prefetch(self, e: AdapterEntry) -> None:
        """Start reading ``e`` in the background unless it is here or on its way."""
        if e.key in self._copies or e.key in self._loading:
            return
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lora-prefetch")
        self._loading[e.key] = self._prefetcher.submit(self.read, e.path, e.info.sha256)
        self.counters["prefetches"] += 1

    def ready(self, e: AdapterEntry) -> bool:
        """A step using ``e`` would not wait for a disk read."""
        if e.key in self._copies:
            return True
        fut = self._loading.get(e.key)
        return fut is not None and fut.done()

    def drop(self, key: AdapterKey) -> None:
        self._copies.pop(key, None)
        self._loading.pop(key, None)

    def clear(self) -> None:
        """Forget every copy (the next use reads the files again and checks their hash)."""
        self._copies.clear()
        self._loading.clear()

    def names(self) -> list[str]:
        return [name for name, _ in self._copies]

    def nbytes(self) -> int:
        return sum(loaded.nbytes for loaded in self._copies.values())

    def num_loading(self) -> int:
        return len(self._loading)

    def _pinned(self, loaded: LoadedAdapter) -> LoadedAdapter:
        if self.device.type == "cuda":  # pinned host memory: slot writes become async DMA
            for layers in loaded.projections.values():
                for p in layers:
                    if p is not None:
                        p.a, p.b = p.a.pin_memory(), p.b.pin_memory()
        return loaded
