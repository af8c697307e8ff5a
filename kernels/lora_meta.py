"""Per-step description of which tokens use which LoRA slot.

Built once per engine step and shared by every LoRA-wrapped layer, so the (cheap but not free)
run-length encoding of token slots is not repeated per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoraSegments:
    """Tokens grouped into contiguous runs that share one adapter slot.

    ``seg_starts[i]:seg_starts[i+1]`` are the token rows of segment ``i``; ``seg_slots[i]`` is its
    adapter slot (-1 = base model only, skipped by every op). Tensors live on the compute device;
    the ``*_list`` twins are host copies for the torch reference path and launch sizing.
    """

    seg_starts: torch.Tensor  # int32 [num_segments + 1]
    seg_slots: torch.Tensor  # int32 [num_segments]
    starts_list: tuple[int, ...]
    slots_list: tuple[int, ...]
    max_seg_len: int
    num_tokens: int

    @property
    def num_segments(self) -> int:
        return len(self.slots_list)

    @property
    def has_lora(self) -> bool:
        return any(s >= 0 for s in self.slots_list)


def make_lora_segments(token_slots: list[int] | torch.Tensor, device: torch.device | str = "cpu") -> LoraSegments:
    """Run-length encode per-token adapter slots. Tokens are NOT reordered: the engine orders
    sequences by slot when it builds the batch so runs are long."""
    if isinstance(token_slots, torch.Tensor):
        token_slots = token_slots.tolist()
    starts: list[int] = []
    slots: list[int] = []
    prev = None
    for i, s in enumerate(token_slots):
        if s != prev:
            starts.append(i)
            slots.append(int(s))
            prev = s
    n = len(token_slots)
    starts.append(n)
    max_len = max((starts[i + 1] - starts[i] for i in range(len(slots))), default=0)
    return LoraSegments(
        seg_starts=torch.tensor(starts, dtype=torch.int32, device=device),
        seg_slots=torch.tensor(slots, dtype=torch.int32, device=device),
        starts_list=tuple(starts),
        slots_list=tuple(slots),
        max_seg_len=max_len,
        num_tokens=n,
    )
