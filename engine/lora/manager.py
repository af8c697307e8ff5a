"""LoRAManager: registry -> host (CPU) cache -> device slots, refreshed once per engine step.

Tiers:
  * registry: adapter name -> (path, version, sha256). ``add_adapter`` validates the files; a name
    re-added with different content becomes a new version, so nothing cached for the old content is
    ever served again (host and device copies are keyed by (name, version)).
  * host cache: up to ``max_cpu_loras`` loaded adapters, LRU (idle adapters are evicted first).
  * device slots: ``max_loras`` slots stacked inside each targeted ``Projection``, allocated the
    first time an adapter targeting that projection is made resident: base-only serving, and
    projections no adapter targets, pay nothing (their forward skips SGMV). ``prepare`` makes the step's adapters
    resident, reusing free slots first, then the least recently used slot NOT needed this step.

Prefetch: when a request is queued for an adapter that is not in the host cache, its files are read
and converted on a background thread (``load_adapter`` touches no manager state) while the engine
runs its current steps; the step that first needs it takes the finished copy, and waits only if the
load is still running. ``host_ready(name)`` tells a scheduler whether that wait would happen.

Removal: ``remove_adapter`` unregisters the name at once (new requests naming it are refused with
``UnknownAdapterError``), while requests already queued or running with it FINISH normally on the
weights they started with; its host and device copies are dropped when the last of them finishes.
Until then the name cannot be re-added (``InvalidRequestError``), because two versions would share
one name in the scheduler and the step's slot map.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import EngineConfig
from ..errors import InvalidRequestError, UnknownAdapterError
from ..models.config import ModelConfig
from ..sequence import AdapterRef
from .loader import LoadedAdapter, load_adapter
from .validate import AdapterInfo

log = logging.getLogger("loraplex.engine.lora")

_Key = tuple[str, int]  # (name, version)


class AdapterNotFoundError(UnknownAdapterError, KeyError):
    """No adapter of that name is registered (also a KeyError, for dict-like callers)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass
class _Entry:
    name: str
    path: str
    version: int
    info: AdapterInfo
    removed: bool = False  # unregistered, draining its in-flight requests
    num_requests: int = 0  # queued + running

    @property
    def key(self) -> _Key:
        return (self.name, self.version)


def resolve_lora_dtype(setting: str, compute_dtype: torch.dtype, device: torch.device, kernels: str) -> torch.dtype:
    """The storage dtype of adapter weights for ``EngineConfig.lora_dtype`` (``kernels``: the
    runner's KernelOps name). ``auto`` stores float16 beside a float32 model only where the native
    CPU SGMV converts it in vector registers (measured faster: half the bytes, same math); a CPU
    whose build lacks AVX-512/F16C, the torch path and CUDA keep the model dtype."""
    if setting == "model":
        return compute_dtype
    if setting != "auto":
        return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[setting]
    if device.type == "cpu" and compute_dtype == torch.float32 and kernels == "cpu":
        from loraplex.kernels import cpu_native

        if cpu_native.fast_float16():
            return torch.float16
    return compute_dtype


class LoRAManager:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, model: torch.nn.Module, kernels: str = "torch"):
        self.max_loras = config.max_loras
        self.max_cpu_loras = config.max_cpu_loras
        self.max_lora_rank = config.max_lora_rank
        self.model_config = model_config
        self.model = model
        self._projections = model.lora_projections()  # type: ignore[operator]  # our model classes define it
        self._mirrors: list[dict] = []  # a shape-compatible draft model's projections (mirror_into)
        first = self._projections["qkv_proj"][0]
        self.device = first.device
        # Adapter weights are stored (host cache and slots) in this dtype; the kernels compute in fp32.
        self.dtype = resolve_lora_dtype(config.lora_dtype, first.compute_dtype, first.device, kernels)
        self._entries: dict[str, _Entry] = {}  # active and draining
        self._versions = itertools.count(1)
        self._cpu: OrderedDict[_Key, LoadedAdapter] = OrderedDict()
        self._slots: list[_Key | None] = [None] * self.max_loras
        self._slot_of: dict[_Key, int] = {}
        self._slot_used: list[int] = [0] * self.max_loras  # step of last use, for LRU
        self._step = 0
        self.slots_allocated = False
        self._loading: dict[_Key, Future[LoadedAdapter]] = {}  # host-cache misses being prefetched
        self._prefetcher: ThreadPoolExecutor | None = None
        self.counters = {
            "disk_loads": 0,
            "prefetches": 0,
            "prefetch_ready": 0,  # the step found the prefetched copy finished
            "prefetch_waits": 0,  # the step had to wait for it
            "cpu_hits": 0,
            "cpu_evictions": 0,
            "slot_loads": 0,
            "slot_hits": 0,
            "slot_evictions": 0,
            "max_adapters_per_step": 0,
        }

    # ------------------------------------------------------------------ registry
    def has(self, name: str) -> bool:
        e = self._entries.get(name)
        return e is not None and not e.removed

    def list_adapters(self) -> list[str]:
        return sorted(n for n, e in self._entries.items() if not e.removed)

    def resident_adapters(self) -> set[str]:
        """Names of the adapters now in device slots (the fair policy prefers them within a slack)."""
        return {key[0] for key in self._slots if key is not None}

    def resident_slots(self) -> dict[AdapterRef, int]:
        """The device slot of every adapter resident now, keyed by the exact content (name and
        version) it holds: a speculative draft sharing these slots applies a row's adapter only
        when its slot still holds that row's version."""
        out = {}
        for slot, key in enumerate(self._slots):
            e = self._entries.get(key[0]) if key is not None else None
            if key is not None and e is not None and e.version == key[1]:
                out[AdapterRef(name=e.name, version=e.version, sha256=e.info.sha256)] = slot
        return out

    def mirror_into(self, model: torch.nn.Module) -> bool:
        """Also write every adapter slot into ``model``'s projections (a draft checkpoint whose
        LoRA-targetable projections have the target's shapes, layer by layer), so the draft can
        apply a row's adapter at the same slot. False, and nothing attached, when shapes differ."""
        theirs = model.lora_projections()  # type: ignore[operator]  # our model classes define it
        for fused, mine in self._projections.items():
            other = theirs.get(fused, [])
            if len(other) != len(mine) or any(
                (a.in_features, a.slice_sizes) != (b.in_features, b.slice_sizes) for a, b in zip(mine, other)
            ):
                return False
        self._mirrors.append(theirs)
        return True

    def ref(self, name: str) -> AdapterRef:
        """The typed identity of the registered adapter ``name`` (raises AdapterNotFoundError)."""
        e = self._entries.get(name)
        if e is None or e.removed:
            raise AdapterNotFoundError(f"unknown adapter {name!r}", param="model")
        return AdapterRef(name=name, version=e.version, sha256=e.info.sha256)

    def info(self, name: str) -> AdapterInfo:
        if not self.has(name):
            raise AdapterNotFoundError(f"unknown adapter {name!r}", param="model")
        return self._entries[name].info

    def add_adapter(self, name: str, path: str | Path) -> AdapterInfo:
        """Validate ``path`` and register it as ``name`` (loading it into the host cache). Raises
        ``AdapterValidationError`` for a bad adapter; the engine's state is then unchanged."""
        return self.register(name, path, self.load(name, path))

    def load(self, name: str, path: str | Path) -> LoadedAdapter:
        """The slow half of ``add_adapter`` (read, validate, convert): touches no manager state, so
        a server runs it off the engine thread and only ``register`` between two steps."""
        if not isinstance(name, str) or not name.strip():
            raise InvalidRequestError(f"adapter name must be a non-empty string, got {name!r}", param="name")
        return load_adapter(path, self.model_config, self.max_lora_rank, self.dtype)

    def register(self, name: str, path: str | Path, loaded: LoadedAdapter) -> AdapterInfo:
        old = self._entries.get(name)
        if old is not None:
            if old.info.sha256 == loaded.info.sha256:
                # Same content: nothing to reload. Re-added while draining (e.g. its cached files
                # were evicted and fetched again): it simply stays registered.
                old.path, old.removed = str(path), False
                return old.info
            if old.num_requests:
                raise InvalidRequestError(
                    f"adapter {name!r} cannot be replaced while {old.num_requests} request(s) still use it; "
                    f"wait for them to finish or register the new version under another name",
                    param="name",
                )
            self._drop(old)
        entry = _Entry(name=name, path=str(path), version=next(self._versions), info=loaded.info)
        self._entries[name] = entry
        self._ensure_slots()
        self._cpu_put(entry.key, self._host_copy(loaded))
        log.info(
            "registered adapter %s v%d (rank %d, %s)",
            name,
            entry.version,
            loaded.info.rank,
            ",".join(loaded.info.target_modules),
        )
        return loaded.info

    def remove_adapter(self, name: str) -> None:
        e = self._entries.get(name)
        if e is None or e.removed:
            raise AdapterNotFoundError(f"unknown adapter {name!r}", param="model")
        if e.num_requests:
            e.removed = True  # drains: dropped by on_request_finished
        else:
            self._drop(e)

    def _drop(self, e: _Entry) -> None:
        self._entries.pop(e.name, None)
        self._cpu.pop(e.key, None)
        self._loading.pop(e.key, None)
        slot = self._slot_of.pop(e.key, None)
        if slot is not None:
            self._slots[slot] = None
            self._write_slot(slot, None)

    # ------------------------------------------------------------------ request hooks (engine)
    def on_request_added(self, name: str) -> None:
        e = self._entries[name]
        e.num_requests += 1
        self.prefetch(name)

    def prefetch(self, name: str) -> None:
        """Start loading ``name`` into the host cache in the background, unless it is there or
        on its way (called for every queued request)."""
        e = self._entries.get(name)
        if e is None or e.key in self._cpu or e.key in self._loading:
            return
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lora-prefetch")
        self._loading[e.key] = self._prefetcher.submit(
            load_adapter, e.path, self.model_config, self.max_lora_rank, self.dtype, e.info.sha256
        )
        self.counters["prefetches"] += 1

    def host_ready(self, name: str) -> bool:
        """True when a step using ``name`` would not wait for a disk read (host copy present, or
        its prefetch finished). A scheduler may prefer such requests; unknown names are ready."""
        e = self._entries.get(name)
        if e is None or e.key in self._cpu:
            return True
        fut = self._loading.get(e.key)
        return fut is not None and fut.done()

    def on_request_finished(self, name: str) -> None:
        e = self._entries.get(name)
        if e is None:
            return
        e.num_requests = max(0, e.num_requests - 1)
        if e.removed and e.num_requests == 0:
            self._drop(e)

    # ------------------------------------------------------------------ per step
    def prepare(self, adapters: set[str]) -> dict[str, int]:
        """Make every adapter of this step resident; returns name -> device slot."""
        if not adapters:
            return {}
        if len(adapters) > self.max_loras:
            raise RuntimeError(f"step uses {len(adapters)} adapters but max_loras={self.max_loras}")
        self._step += 1
        self.counters["max_adapters_per_step"] = max(self.counters["max_adapters_per_step"], len(adapters))
        entries = []
        for name in adapters:
            e = self._entries.get(name)
            if e is None:
                raise RuntimeError(f"adapter {name!r} is scheduled but not registered")
            entries.append(e)
        needed = {e.key for e in entries}
        slots: dict[str, int] = {}
        for e in entries:
            slot = self._slot_of.get(e.key)
            if slot is None:
                slot = self._claim_slot(needed)
                self._write_slot(slot, self._cpu_get(e))
                self._slots[slot] = e.key
                self._slot_of[e.key] = slot
                self.counters["slot_loads"] += 1
            else:
                self.counters["slot_hits"] += 1
            self._slot_used[slot] = self._step
            slots[e.name] = slot
        return slots

    def _claim_slot(self, needed: set[_Key]) -> int:
        free = [s for s, k in enumerate(self._slots) if k is None]
        if free:
            return free[0]
        victims = [s for s, k in enumerate(self._slots) if k not in needed]
        if not victims:  # unreachable while len(adapters) <= max_loras
            raise RuntimeError("no LoRA slot can be freed")
        slot = min(victims, key=lambda s: self._slot_used[s])
        old_key = self._slots[slot]
        if old_key is not None:
            self._slot_of.pop(old_key, None)
        self._slots[slot] = None
        self.counters["slot_evictions"] += 1
        return slot

    # ------------------------------------------------------------------ host tier
    def _cpu_get(self, e: _Entry) -> LoadedAdapter:
        loaded = self._cpu.get(e.key)
        if loaded is not None:
            self._cpu.move_to_end(e.key)
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
            loaded = load_adapter(
                e.path, self.model_config, self.max_lora_rank, self.dtype, expected_sha256=e.info.sha256
            )
        self._cpu_put(e.key, self._host_copy(loaded))
        return loaded

    def _cpu_put(self, key: _Key, loaded: LoadedAdapter) -> None:
        self.counters["disk_loads"] += 1
        self._cpu[key] = loaded
        self._cpu.move_to_end(key)
        while len(self._cpu) > self.max_cpu_loras:
            # Evict the least recently used adapter that no request is waiting on, if any.
            busy = {e.key for e in self._entries.values() if e.num_requests}
            victim = next((k for k in self._cpu if k not in busy and k != key), next(iter(self._cpu)))
            del self._cpu[victim]
            self.counters["cpu_evictions"] += 1

    def _host_copy(self, loaded: LoadedAdapter) -> LoadedAdapter:
        if self.device.type == "cuda":  # pinned host memory: slot writes become async DMA
            for layers in loaded.projections.values():
                for p in layers:
                    if p is not None:
                        p.a, p.b = p.a.pin_memory(), p.b.pin_memory()
        return loaded

    # ------------------------------------------------------------------ device tier
    def _ensure_slots(self) -> None:
        # Buffers are allocated per projection when the first adapter targeting it is written into
        # a slot: a projection no adapter targets keeps lora_a None and its forward skips SGMV.
        self.slots_allocated = True

    @torch.inference_mode()
    def _write_slot(self, slot: int, loaded: LoadedAdapter | None) -> None:
        if not self.slots_allocated:
            return
        for projections in (self._projections, *self._mirrors):
            self._write_slot_into(projections, slot, loaded)

    def _write_slot_into(self, projections: dict, slot: int, loaded: LoadedAdapter | None) -> None:
        for fused, layers in projections.items():
            per_layer = loaded.projections[fused] if loaded is not None else [None] * len(layers)
            for proj, p in zip(layers, per_layer):
                if proj.lora_a is None:
                    if p is None:
                        continue
                    proj.allocate_lora_slots(self.max_loras, self.max_lora_rank, self.dtype)
                proj.lora_a[:, slot].zero_()
                proj.lora_b[slot].zero_()
                if p is None:
                    proj.lora_ranks[slot] = 0
                    proj.lora_scales[slot] = 0.0
                    continue
                proj.lora_a[:, slot, : p.rank].copy_(p.a, non_blocking=True)
                proj.lora_b[slot, : p.rank].copy_(p.b, non_blocking=True)
                proj.lora_ranks[slot] = p.rank
                proj.lora_scales[slot] = p.scale

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        return {
            "registered": self.list_adapters(),
            "draining": sorted(n for n, e in self._entries.items() if e.removed),
            "cpu_cached": [name for name, _ in self._cpu],
            "cpu_cached_bytes": sum(loaded.nbytes for loaded in self._cpu.values()),
            "prefetching": len(self._loading),
            "resident": {slot: key[0] for slot, key in enumerate(self._slots) if key is not None},
            "active_requests": {n: e.num_requests for n, e in self._entries.items() if e.num_requests},
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_cpu_loras,
            "max_lora_rank": self.max_lora_rank,
            "lora_dtype": str(self.dtype).removeprefix("torch."),
            "slots_allocated": self.slots_allocated,
            "projections_with_slots": sum(p.lora_a is not None for ps in self._projections.values() for p in ps),
            **self.counters,
        }
