"""Triton KV-cache write: each new token's key and value go to their paged slots.

Cache layout (shared with ``reference`` and both attention modules): ``[num_blocks, block_size,
num_kv_heads, head_dim]``. A token at logical position ``p`` of sequence ``s`` lives in physical
block ``block_tables[s, p // block_size]`` at row ``p % block_size``; ``slot_mapping`` holds
``block * block_size + row`` per token (-1: padding, skipped).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(  # type: ignore[no-untyped-def]
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    num_heads,
    head_dim,
    block_size,
    sk_t,
    sk_h,
    sk_d,
    sv_t,
    sv_h,
    sv_d,
    sc_b,
    sc_p,
    sc_h,
    sc_d,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < head_dim)
        dst = (slot // block_size) * sc_b + (slot % block_size) * sc_p + offs_h[:, None] * sc_h + offs_d[None, :] * sc_d
        k = tl.load(k_ptr + t * sk_t + offs_h[:, None] * sk_h + offs_d[None, :] * sk_d, mask=mask)
        v = tl.load(v_ptr + t * sv_t + offs_h[:, None] * sv_h + offs_d[None, :] * sv_d, mask=mask)
        tl.store(kc_ptr + dst, k, mask=mask)
        tl.store(vc_ptr + dst, v, mask=mask)


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same contract as ``reference.write_kv``. A Triton kernel rather than ``index_copy_`` so that
    padding slots (< 0) are skipped on the device with no boolean-mask host sync and no copies of
    k/v; one program per (token, head tile)."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    assert k_cache.stride() == v_cache.stride(), "k and v caches must share a layout"
    # Cast with torch (round-to-nearest everywhere; the interpreter truncates fp32 -> bf16), so the
    # kernel is a pure copy. Only this step's tokens are cast.
    k = k.to(k_cache.dtype)
    v = v.to(v_cache.dtype)
    _, block_size, num_heads, head_dim = k_cache.shape
    block_d = triton.next_power_of_2(head_dim)
    block_h = max(1, min(triton.next_power_of_2(num_heads), 4096 // block_d))
    grid = (num_tokens, triton.cdiv(num_heads, block_h))
    _write_kv_kernel[grid](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        num_heads,
        head_dim,
        block_size,
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        BLOCK_H=block_h,
        BLOCK_D=block_d,
    )


__all__ = ["write_kv"]
