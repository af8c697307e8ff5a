"""Helpers shared by the Triton kernels (SGMV and paged attention)."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # softmax in base 2: exp(x) = exp2(x * log2(e))


@functools.lru_cache(maxsize=8)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sm_count(device: torch.device) -> int:
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


@triton.jit
def dot(a, b, F32: tl.constexpr):  # type: ignore[no-untyped-def]
    """``tl.dot`` with fp32 accumulation. ``F32``: upcast operands and multiply in IEEE fp32 — for
    fp32 models (no TF32 rounding) and for bf16 under TRITON_INTERPRET, whose numpy dot cannot
    multiply bf16 (it stores bf16 as uint16 bit patterns; triton issue #11584). bf16 products are
    exact in fp32, so the upcast computes what the GPU's bf16 tensor-core dot computes."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


def dot_in_f32(dtype: torch.dtype, device: torch.device) -> bool:
    return dtype == torch.float32 or (dtype == torch.bfloat16 and device.type != "cuda")
