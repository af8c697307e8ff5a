"""Grouped LoRA SGMV on the native CPU library (``csrc/cpu_sgmv.cpp``, built and loaded by
``cpu_native``): same contract as ``reference.sgmv_shrink`` / ``sgmv_expand``.

Why native: the torch path gathers each token's A and B (``index_select``, a copy per token) and
multiplies with a broadcast that materialises [slices, tokens, rank, hidden] in fp32; over tens of
distinct adapters that was ~40% of a decode step. The native one groups the step's tokens by slot
(once per step, shared by every layer) and reads each adapter's A rows / B column chunks once per
group, straight from the stacked slot tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from . import cpu_native, reference
from .lora_meta import LoraSegments
from .profiler_range import profiler_range


# ------------------------------------------------------------------------------------------ LoRA
class _SlotGroups:
    """The step's tokens grouped by adapter slot (slot -1 left out): computed once per step and
    shared by every LoRA layer, memoised on the (frozen) segments like the torch path's plan."""

    __slots__ = ("group_slot", "group_start", "token_idx", "num_groups")

    def __init__(self, segments: LoraSegments):
        by_slot: dict[int, list[int]] = {}
        starts = segments.starts_list
        for i, slot in enumerate(segments.slots_list):
            if slot >= 0:
                by_slot.setdefault(slot, []).extend(range(starts[i], starts[i + 1]))
        order = sorted(by_slot)
        group_start = [0]
        tokens: list[int] = []
        for slot in order:
            tokens.extend(by_slot[slot])
            group_start.append(len(tokens))
        self.num_groups = len(order)
        self.group_slot = torch.tensor(order, dtype=torch.int32)
        self.group_start = torch.tensor(group_start, dtype=torch.int32)
        self.token_idx = torch.tensor(tokens, dtype=torch.int32)


def _groups(segments: LoraSegments) -> _SlotGroups:
    groups = segments.__dict__.get("_cpu_sgmv_groups")
    if groups is None:
        groups = _SlotGroups(segments)
        object.__setattr__(segments, "_cpu_sgmv_groups", groups)  # private memo on a frozen dataclass
    return groups


def _sgmv_supported(act: torch.Tensor, weights: torch.Tensor) -> bool:
    """Activations float32/bf16, adapter weights float32/bf16/float16 (any pairing), on the CPU."""
    return (
        cpu_native._lib is not None
        and act.dtype in cpu_native.SGMV_ACTIVATIONS
        and weights.dtype in cpu_native.SGMV_DTYPES
        and act.device.type == "cpu"
        and weights.device.type == "cpu"
    )


def _sgmv_fn(op: str, act: torch.dtype, weights: torch.dtype) -> Any:  # a ctypes function
    return getattr(cpu_native._lib, f"lp_sgmv_{op}_{cpu_native.SGMV_DTYPES[act]}_{cpu_native.SGMV_DTYPES[weights]}")


# A group of at least this many consecutive tokens of one adapter (a prompt chunk; decode groups are
# 1-4 tokens) runs on the vdpbf16ps tiles when activations and weights are bf16 (csrc/cpu_sgmv.cpp).
PROMPT_GROUP_MIN_TOKENS = 16


def prompt_groups_available() -> bool:
    """True when the built kernels run prompt-sized bf16 groups on vdpbf16ps tiles (AVX512-BF16)."""
    lib = cpu_native.load()
    return lib is not None and bool(lib.lp_sgmv_prompt_groups())


def _prompt_group_fn(op: str, act: torch.Tensor, weights: torch.Tensor, prompt_groups: bool) -> Any:
    """The ``_groups`` entry point (same arguments plus the group threshold) where it applies."""
    # The library is loaded (the caller checked): read it directly, not through load()'s lock, ~240
    # calls a step with adapters.
    lib = cpu_native._lib
    if (
        prompt_groups
        and act.dtype == weights.dtype == torch.bfloat16
        and lib is not None
        and lib.lp_sgmv_prompt_groups()
    ):
        return getattr(lib, f"lp_sgmv_{op}_bf16_bf16_groups")
    return None


_offsets_memo: dict[tuple[int, ...], torch.Tensor] = {}


def _offsets(slice_offsets: tuple[int, ...]) -> torch.Tensor:
    t = _offsets_memo.get(slice_offsets)
    if t is None:  # a handful of distinct tuples per model (one per fused projection shape)
        t = _offsets_memo[slice_offsets] = torch.tensor(slice_offsets, dtype=torch.int32)
    return t


def sgmv_shrink(
    x: torch.Tensor, lora_a: torch.Tensor, segments: LoraSegments, ranks: torch.Tensor, *, prompt_groups: bool = True
) -> torch.Tensor:
    """Same contract as ``reference.sgmv_shrink``. ``prompt_groups=False`` keeps prompt-sized bf16
    groups on the per-token loops (a token's bits then never depend on its group: batch invariance)."""
    if not segments.has_lora or not _sgmv_supported(x, lora_a) or x.stride(-1) != 1:
        return reference.sgmv_shrink(x, lora_a, segments, ranks)
    assert cpu_native._lib is not None
    num_slices, num_slots, max_rank, hidden = lora_a.shape
    out = torch.zeros(num_slices, x.shape[0], max_rank, dtype=torch.float32)
    lora_a = lora_a.contiguous()
    ranks = ranks.to(torch.int32).contiguous()
    g = _groups(segments)
    fn = _sgmv_fn("shrink", x.dtype, lora_a.dtype)
    args = (
        x.data_ptr(), x.stride(0), lora_a.data_ptr(), out.data_ptr(), x.shape[0], hidden, num_slices,
        num_slots, max_rank, ranks.data_ptr(), g.group_slot.data_ptr(), g.group_start.data_ptr(),
        g.num_groups, g.token_idx.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    groups_fn = _prompt_group_fn("shrink", x, lora_a, prompt_groups)
    with profiler_range("loraplex::cpu_sgmv_shrink"):  # step_profile.py files these under LoRA
        if groups_fn is not None:
            groups_fn(*args, PROMPT_GROUP_MIN_TOKENS)
        else:
            fn(*args)
    return out


def sgmv_expand(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    segments: LoraSegments,
    ranks: torch.Tensor,
    scales: torch.Tensor,
    slice_offsets: tuple[int, ...],
    *,
    prompt_groups: bool = True,
) -> torch.Tensor:
    """Same contract as ``reference.sgmv_expand`` (``y`` updated in place and returned);
    ``prompt_groups`` as in ``sgmv_shrink``."""
    if (
        not segments.has_lora
        or not _sgmv_supported(y, lora_b)
        or y.stride(-1) != 1
        or slice_offsets[-1] > y.shape[1]
        or lora_b.shape[2] != y.shape[1]
    ):
        return reference.sgmv_expand(y, shrunk, lora_b, segments, ranks, scales, slice_offsets)
    assert cpu_native._lib is not None
    num_slots, max_rank, total_out = lora_b.shape
    shrunk = shrunk.to(torch.float32).contiguous()
    lora_b = lora_b.contiguous()
    ranks = ranks.to(torch.int32).contiguous()
    scales = scales.to(torch.float32).contiguous()
    offsets = _offsets(slice_offsets)
    g = _groups(segments)
    fn = _sgmv_fn("expand", y.dtype, lora_b.dtype)
    args = (
        y.data_ptr(), y.stride(0), shrunk.data_ptr(), lora_b.data_ptr(), y.shape[0], total_out, num_slots,
        max_rank, ranks.data_ptr(), scales.data_ptr(), offsets.data_ptr(), len(slice_offsets) - 1,
        g.group_slot.data_ptr(), g.group_start.data_ptr(), g.num_groups, g.token_idx.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    groups_fn = _prompt_group_fn("expand", y, lora_b, prompt_groups)
    with profiler_range("loraplex::cpu_sgmv_expand"):  # step_profile.py files these under LoRA
        if groups_fn is not None:
            groups_fn(*args, PROMPT_GROUP_MIN_TOKENS)
        else:
            fn(*args)
    return y
