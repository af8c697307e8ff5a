"""LoRAManager: the engine's one handle on adapters, three tiers behind it, refreshed once per step.

  * ``AdapterRegistry`` (registry.py): name -> (path, version, sha256) and who still uses it. A name
    re-added with different content is a new version; removal drains the requests holding it.
  * ``HostCache`` (host_cache.py): up to ``max_cpu_loras`` converted copies in host memory, LRU,
    prefetched off the step when a request is queued.
  * ``DeviceSlots`` (device_slots.py): ``max_loras`` slots stacked in each targeted projection;
    ``prepare`` makes a step's adapters resident.

This class only routes between them (what the registry decides to drop leaves the other two tiers
too) and reports; each tier owns its own state. Removal: ``remove_adapter`` unregisters the name at
once (new requests naming it are refused with ``UnknownAdapterError``) while requests already
queued or running with it finish on the weights they started with; until then the name cannot be
re-added (``InvalidRequestError``), because two versions would share one name in the step's slot map.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..config import EngineConfig
from ..errors import InvalidRequestError
from ..models.config import ModelConfig
from ..sequence import AdapterRef
from .device_slots import DeviceSlots
from .host_cache import HostCache
from .loader import LoadedAdapter
from .registry import AdapterEntry, AdapterNotFoundError, AdapterRegistry
from .validate import AdapterInfo

log = logging.getLogger("loraplex.engine.lora")

__all__ = ["AdapterNotFoundError", "LoRAManager", "resolve_lora_dtype"]

COUNTERS = (
    "disk_loads",
    "prefetches",
    "prefetch_ready",  # the step found the prefetched copy finished
    "prefetch_waits",  # the step had to wait for it
    "cpu_hits",
    "cpu_evictions",
    "slot_loads",
    "slot_hits",
    "slot_evictions",
    "max_adapters_per_step",
)


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
        projections = model.lora_projections()  # type: ignore[operator]  # our model classes define it
        first = projections["qkv_proj"][0]
        # Adapter weights are stored (host cache and slots) in this dtype; the kernels compute in fp32.
        self.dtype = resolve_lora_dtype(config.lora_dtype, first.compute_dtype, first.device, kernels)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.registry = AdapterRegistry()
        self.host = HostCache(
            model_config, self.max_cpu_loras, self.max_lora_rank, self.dtype, first.device, self.counters
        )
        self.slots = DeviceSlots(projections, self.max_loras, self.max_lora_rank, self.dtype, self.counters)

    # ------------------------------------------------------------------ registry
    def list_adapters(self) -> list[str]:
        return self.registry.names()

    def ref(self, name: str) -> AdapterRef:
        """The typed identity of the registered adapter ``name`` (raises AdapterNotFoundError)."""
        return self.registry.active(name).ref

    def add_adapter(self, name: str, path: str | Path) -> AdapterInfo:
        """Validate ``path`` and register it as ``name`` (loading it into the host cache). Raises
        ``AdapterValidationError`` for a bad adapter; the engine's state is then unchanged."""
        return self.register(name, path, self.load(name, path))

    def load(self, name: str, path: str | Path) -> LoadedAdapter:
        """The slow half of ``add_adapter`` (read, validate, convert): touches no manager state, so
        a server runs it off the engine thread and only ``register`` between two steps."""
        if not isinstance(name, str) or not name.strip():
            raise InvalidRequestError(f"adapter name must be a non-empty string, got {name!r}", param="name")
        return self.host.read(str(path))

    def register(self, name: str, path: str | Path, loaded: LoadedAdapter) -> AdapterInfo:
        entry, replaced, created = self.registry.add(name, path, loaded.info)
        if not created:
            return entry.info  # the same content is registered already: nothing to reload
        if replaced is not None:
            self._drop(replaced)
        self.slots.writable = True
        self.host.put(entry.key, loaded, self.registry.busy_keys())
        log.info(
            "registered adapter %s v%d (rank %d, %s)",
            name,
            entry.version,
            loaded.info.rank,
            ",".join(loaded.info.target_modules),
        )
        return entry.info

    def remove_adapter(self, name: str) -> None:
        dropped = self.registry.remove(name)
        if dropped is not None:
            self._drop(dropped)

    def _drop(self, e: AdapterEntry) -> None:
        self.host.drop(e.key)
        self.slots.drop(e.key)

    # ------------------------------------------------------------------ request hooks (engine)
    def on_request_added(self, name: str) -> None:
        self.host.prefetch(self.registry.request_added(name))

    def on_request_finished(self, name: str) -> None:
        dropped = self.registry.request_finished(name)
        if dropped is not None:
            self._drop(dropped)

    def host_ready(self, name: str) -> bool:
        """True when a step using ``name`` would not wait for a disk read (host copy present, or
        its prefetch finished). A scheduler may prefer such requests; unknown names are ready."""
        e = self.registry.get(name)
        return e is None or self.host.ready(e)

    # ------------------------------------------------------------------ per step
    def prepare(self, adapters: set[str]) -> dict[str, int]:
        """Make every adapter of this step resident; returns name -> device slot."""
        if not adapters:
            return {}
        if len(adapters) > self.max_loras:
            raise RuntimeError(f"step uses {len(adapters)} adapters but max_loras={self.max_loras}")
        self.counters["max_adapters_per_step"] = max(self.counters["max_adapters_per_step"], len(adapters))
        entries = {}
        for name in adapters:
            e = self.registry.get(name)
            if e is None:
                raise RuntimeError(f"adapter {name!r} is scheduled but not registered")
            entries[e.key] = e
        busy = self.registry.busy_keys()
        slots = self.slots.assign(list(entries), lambda key: self.host.get(entries[key], busy))
        return {entries[key].name: slot for key, slot in slots.items()}

    def resident_adapters(self) -> set[str]:
        """Names of the adapters now in device slots (the fair policy prefers them within a slack)."""
        return {key[0] for key in self.slots.resident()}

    def resident_slots(self) -> dict[AdapterRef, int]:
        """The device slot of every adapter resident now, keyed by the exact content (name and
        version) it holds: a speculative draft sharing these slots applies a row's adapter only
        when its slot still holds that row's version."""
        out = {}
        for (name, version), slot in self.slots.resident().items():
            e = self.registry.get(name)
            if e is not None and e.version == version:
                out[e.ref] = slot
        return out

    @property
    def slots_allocated(self) -> bool:
        return self.slots.writable

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        return {
            "registered": self.registry.names(),
            "draining": self.registry.draining(),
            "cpu_cached": self.host.names(),
            "cpu_cached_bytes": self.host.nbytes(),
            "prefetching": self.host.num_loading(),
            "resident": {slot: key[0] for key, slot in sorted(self.slots.resident().items(), key=lambda kv: kv[1])},
            "active_requests": self.registry.active_requests(),
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_cpu_loras,
            "max_lora_rank": self.max_lora_rank,
            "lora_dtype": str(self.dtype).removeprefix("torch."),
            "slots_allocated": self.slots.writable,
            "projections_with_slots": self.slots.num_allocated(),
            **self.counters,
        }
