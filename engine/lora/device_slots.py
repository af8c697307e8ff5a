"""DeviceSlots: ``max_loras`` adapter slots stacked inside each targeted projection.

The last tier: what a step's SGMV kernels index by slot. Slot buffers are allocated per projection
the first time an adapter targeting it is written: base-only serving, and projections no adapter
targets, pay nothing (their forward skips SGMV). ``assign`` makes a step's adapters resident,
reusing free slots first, then the least recently used slot NOT needed this step. A draft model
whose projections have the target's shapes can get every slot write mirrored (``mirror_into``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .loader import LoadedAdapter
from .registry import AdapterKey


class DeviceSlots:
    def __init__(
        self,
        projections: dict,
        max_loras: int,
        max_lora_rank: int,
        dtype: torch.dtype,
        counters: dict[str, int],
    ):
        self._projections = projections  # fused module name -> per-layer Projection
        self._mirrors: list[dict] = []  # a shape-compatible draft model's projections (mirror_into)
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.dtype = dtype
        self.counters = counters  # the LoRA manager's, shared by its tiers
        self._keys: list[AdapterKey | None] = [None] * max_loras
        self._slot_of: dict[AdapterKey, int] = {}
        self._last_used: list[int] = [0] * max_loras  # step of last use, for LRU
        self._step = 0
        self.writable = False  # set when the first adapter registers (base-only serving writes none)

    def assign(self, keys: list[AdapterKey], load: Callable[[AdapterKey], LoadedAdapter]) -> dict[AdapterKey, int]:
        """Make every key of this step resident (``load`` gives a missing one's host copy)."""
        self._step += 1
        needed = set(keys)
        slots: dict[AdapterKey, int] = {}
        for key in keys:
            slot = self._slot_of.get(key)
            if slot is None:
                slot = self._claim(needed)
                self._write(slot, load(key))
                self._keys[slot] = key
                self._slot_of[key] = slot
                self.counters["slot_loads"] += 1
            else:
                self.counters["slot_hits"] += 1
            self._last_used[slot] = self._step
            slots[key] = slot
        return slots

    def resident(self) -> dict[AdapterKey, int]:
        return dict(self._slot_of)

    def drop(self, key: AdapterKey) -> None:
        slot = self._slot_of.pop(key, None)
        if slot is not None:
            self._keys[slot] = None
            self._write(slot, None)

    def clear(self) -> None:
        """Forget which slot holds what (the next step writes its adapters again)."""
        self._slot_of.clear()
        self._keys = [None] * self.max_loras

    def mirror_into(self, model: torch.nn.Module) -> bool:
        """Also write every slot into ``model``'s projections (a draft checkpoint whose
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

    def num_allocated(self) -> int:
        return sum(p.lora_a is not None for ps in self._projections.values() for p in ps)

    def _claim(self, needed: set[AdapterKey]) -> int:
        free = [s for s, k in enumerate(self._keys) if k is None]
        if free:
            return free[0]
        victims = [s for s, k in enumerate(self._keys) if k not in needed]
        if not victims:  # unreachable while a step has at most max_loras adapters
            raise RuntimeError("no LoRA slot can be freed")
        slot = min(victims, key=lambda s: self._last_used[s])
        old = self._keys[slot]
        if old is not None:
            self._slot_of.pop(old, None)
        self._keys[slot] = None
        self.counters["slot_evictions"] += 1
        return slot

    @torch.inference_mode()
    def _write(self, slot: int, loaded: LoadedAdapter | None) -> None:
        if not self.writable:
            return
        for projections in (self._projections, *self._mirrors):
            self._write_into(projections, slot, loaded)

    def _write_into(self, projections: dict, slot: int, loaded: LoadedAdapter | None) -> None:
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
