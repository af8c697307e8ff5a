"""Triton SGMV (segmented gather matrix-vector / matrix-matrix) for multi-LoRA, Punica-style.

Tokens arrive grouped in contiguous segments that share one adapter slot (``LoraSegments``). One
launch covers every segment, every output slice (fused q|k|v or gate|up) and every tile:

  shrink: out[i, t, :r]        = x[t] @ lora_a[i, s, :r].T                      (hidden -> rank)
  expand: y[t, off_i:off_i+1] += scale[s] * shrunk[i, t, :r] @ lora_b[s, :r, off_i:off_i+1]

Two shapes of tile, picked by the longest segment:
  * prefill-sized segments (> ``GEMV_MAX_SEG``): ``tl.dot`` tiles (tensor cores for fp16/bf16),
    fp32 accumulation;
  * decode-sized segments: a GEMV-shaped tile (broadcast multiply + reduction, no padding of the
    token dimension to 16) and, for shrink, split-K over ``hidden`` so a handful of segments still
    fills the GPU; the split partials are summed by one small torch reduction (deterministic, no
    atomics).

Rank per slot: shrink masks weight rows beyond the slot's rank (masked loads do not touch memory);
expand's reduction loop is bounded by the slot's own rank, so mixed ranks never pay the max rank.
Slot -1 segments: shrink writes zeros for them (the output is fully defined), expand leaves ``y``
untouched. Nothing here syncs with the host: sizes come from the host-side ``LoraSegments`` fields.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lora_meta import LoraSegments
from .triton_common import device_sm_count, dot, dot_in_f32

GEMV_MAX_SEG = 8  # longest segment served by the GEMV-shaped (decode) tiles
_GEMV_TILE_ELEMS = 8192  # BLOCK_M * BLOCK_R * BLOCK_K of one GEMV step: ~64 fp32 regs/thread at 4 warps


def _target_programs(device: torch.device) -> int:
    """Programs that keep every SM busy a few times over (CPU/interpreter: a small constant)."""
    if device.type == "cuda":
        return 4 * device_sm_count(device)
    return 8


_OFFSETS_CACHE: dict[tuple, torch.Tensor] = {}


def _offsets_tensor(slice_offsets: tuple[int, ...], device: torch.device) -> torch.Tensor:
    # Slice offsets are fixed per layer: keep one device copy each instead of a copy per call.
    key = (tuple(int(o) for o in slice_offsets), str(device))
    t = _OFFSETS_CACHE.get(key)
    if t is None:
        t = torch.tensor(key[0], dtype=torch.int32, device=device)
        _OFFSETS_CACHE[key] = t
    return t


# ----------------------------------------------------------------------------------------- shrink
@triton.jit
def _sgmv_shrink_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    a_ptr,
    out_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    ranks_ptr,
    max_rank,
    m_tiles,
    k_per_split,
    k_total,
    sx_t,
    sx_h,
    sa_i,
    sa_s,
    sa_r,
    sa_h,
    so_k,
    so_i,
    so_t,
    so_r,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISE: tl.constexpr,
):
    pid0 = tl.program_id(0)  # segment * m_tiles + token tile
    pid_i = tl.program_id(1)  # slice
    pid_k = tl.program_id(2)  # split of the hidden dimension
    seg = pid0 // m_tiles
    m_tile = pid0 % m_tiles
    t0 = tl.load(seg_starts_ptr + seg)
    t1 = tl.load(seg_starts_ptr + seg + 1)
    m_start = t0 + m_tile * BLOCK_M
    if m_start < t1:
        slot = tl.load(seg_slots_ptr + seg)
        rank = tl.load(ranks_ptr + tl.maximum(slot, 0))
        rank = tl.where(slot >= 0, rank, 0)
        offs_m = m_start + tl.arange(0, BLOCK_M)
        offs_r = tl.arange(0, BLOCK_R)
        m_mask = offs_m < t1
        r_mask = offs_r < rank
        k_begin = pid_k * k_per_split
        k_end = tl.minimum(k_begin + k_per_split, k_total)
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        if rank > 0:
            a_base = a_ptr + pid_i * sa_i + tl.maximum(slot, 0).to(tl.int64) * sa_s
            for k0 in range(k_begin, k_end, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_mask = offs_k < k_end
                xt = tl.load(
                    x_ptr + offs_m[:, None].to(tl.int64) * sx_t + offs_k[None, :] * sx_h,
                    mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                at = tl.load(  # [BLOCK_K, BLOCK_R]: A stored [rank, hidden], read transposed
                    a_base + offs_r[None, :] * sa_r + offs_k[:, None] * sa_h,
                    mask=r_mask[None, :] & k_mask[:, None],
                    other=0.0,
                )
                if USE_DOT:
                    acc += dot(xt, at, PRECISE)
                else:
                    prod = xt.to(tl.float32)[:, :, None] * at.to(tl.float32)[None, :, :]
                    acc += tl.sum(prod, axis=1)
        out_ptrs = out_ptr + pid_k * so_k + pid_i * so_i + offs_m[:, None].to(tl.int64) * so_t + offs_r[None, :] * so_r
        tl.store(out_ptrs, acc, mask=m_mask[:, None] & (offs_r[None, :] < max_rank))


def _shrink_config(
    segments: LoraSegments, num_slices: int, max_rank: int, hidden: int, device: torch.device
) -> tuple[bool, int, int, int, int, int]:
    """(gemv, BLOCK_M, BLOCK_R, BLOCK_K, split_k, k_per_split) for one shrink launch."""
    block_r = max(16, triton.next_power_of_2(max_rank))
    gemv = segments.max_seg_len <= GEMV_MAX_SEG
    if gemv:
        block_m = triton.next_power_of_2(max(segments.max_seg_len, 1))
        block_k = max(16, min(256, _GEMV_TILE_ELEMS // (block_m * block_r)))
        # Split hidden until segments x slices x splits fills the device.
        have = segments.num_segments * num_slices
        split_k = max(1, min(triton.cdiv(hidden, block_k), triton.cdiv(_target_programs(device), have)))
    else:
        block_m = 32 if segments.max_seg_len <= 32 else 64
        block_k = 64 if block_r <= 64 else 32
        split_k = 1
    k_per_split = triton.cdiv(triton.cdiv(hidden, split_k), block_k) * block_k
    split_k = triton.cdiv(hidden, k_per_split)
    return gemv, block_m, block_r, block_k, split_k, k_per_split


def sgmv_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    segments: LoraSegments,
    ranks: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as ``reference.sgmv_shrink``; ``out`` (float32 [num_slices, num_tokens,
    max_rank]) may be passed to reuse a buffer: every element of it is written."""
    num_slices, _, max_rank, hidden = lora_a.shape
    num_tokens = x.shape[0]
    if out is None:
        out = torch.empty(num_slices, num_tokens, max_rank, dtype=torch.float32, device=x.device)
    if num_tokens == 0 or max_rank == 0:
        return out
    if not segments.has_lora:
        return out.zero_()
    if x.dtype != lora_a.dtype:
        x = x.to(lora_a.dtype)
    gemv, block_m, block_r, block_k, split_k, k_per_split = _shrink_config(
        segments, num_slices, max_rank, hidden, x.device
    )
    num_segments = segments.num_segments
    target = (
        out
        if split_k == 1
        else torch.empty(split_k, num_slices, num_tokens, max_rank, dtype=torch.float32, device=x.device)
    )
    t4 = target if split_k > 1 else out.unsqueeze(0)  # [split, slice, token, rank] either way
    m_tiles = triton.cdiv(segments.max_seg_len, block_m)
    grid = (num_segments * m_tiles, num_slices, split_k)
    _sgmv_shrink_kernel[grid](
        x,
        lora_a,
        t4,
        segments.seg_starts,
        segments.seg_slots,
        ranks,
        max_rank,
        m_tiles,
        k_per_split,
        hidden,
        x.stride(0),
        x.stride(1),
        *lora_a.stride(),
        *t4.stride(),
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        USE_DOT=not gemv,
        PRECISE=dot_in_f32(lora_a.dtype, x.device),
    )
    if split_k > 1:
        torch.sum(target, dim=0, out=out)
    return out


# ----------------------------------------------------------------------------------------- expand
@triton.jit
def _sgmv_expand_kernel(  # type: ignore[no-untyped-def]
    s_ptr,
    b_ptr,
    y_ptr,
    seg_starts_ptr,
    seg_slots_ptr,
    ranks_ptr,
    scales_ptr,
    offsets_ptr,
    m_tiles,
    ss_i,
    ss_t,
    ss_r,
    sb_s,
    sb_r,
    sb_n,
    sy_t,
    sy_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISE: tl.constexpr,
):
    pid0 = tl.program_id(0)  # segment * m_tiles + token tile
    pid_n = tl.program_id(1)  # column tile inside the slice
    pid_i = tl.program_id(2)  # slice
    seg = pid0 // m_tiles
    m_tile = pid0 % m_tiles
    t0 = tl.load(seg_starts_ptr + seg)
    t1 = tl.load(seg_starts_ptr + seg + 1)
    m_start = t0 + m_tile * BLOCK_M
    c0 = tl.load(offsets_ptr + pid_i)
    c1 = tl.load(offsets_ptr + pid_i + 1)
    n_start = c0 + pid_n * BLOCK_N
    slot = tl.load(seg_slots_ptr + seg)
    if (m_start < t1) & (n_start < c1) & (slot >= 0):
        rank = tl.load(ranks_ptr + slot)
        scale = tl.load(scales_ptr + slot).to(tl.float32)
        offs_m = m_start + tl.arange(0, BLOCK_M)
        offs_n = n_start + tl.arange(0, BLOCK_N)
        m_mask = offs_m < t1
        n_mask = offs_n < c1
        b_base = b_ptr + slot.to(tl.int64) * sb_s
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, rank, BLOCK_K):  # bounded by THIS slot's rank
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < rank
            st = tl.load(
                s_ptr + pid_i * ss_i + offs_m[:, None].to(tl.int64) * ss_t + offs_k[None, :] * ss_r,
                mask=m_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            bt = tl.load(
                b_base + offs_k[:, None] * sb_r + offs_n[None, :] * sb_n,
                mask=k_mask[:, None] & n_mask[None, :],
                other=0.0,
            )
            if USE_DOT:
                # Round the fp32 intermediate to the weights' type: a tensor-core dot for fp16/bf16.
                acc += dot(st.to(bt.dtype), bt, PRECISE)
            else:
                prod = st.to(tl.float32)[:, :, None] * bt.to(tl.float32)[None, :, :]
                acc += tl.sum(prod, axis=1)
        y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * sy_t + offs_n[None, :] * sy_n
        mask = m_mask[:, None] & n_mask[None, :]
        y_old = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptrs, (y_old + scale * acc).to(y_ptr.dtype.element_ty), mask=mask)


def sgmv_expand(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    segments: LoraSegments,
    ranks: torch.Tensor,
    scales: torch.Tensor,
    slice_offsets: tuple[int, ...],
) -> torch.Tensor:
    """Same contract as ``reference.sgmv_expand``: adds into ``y`` in place and returns it."""
    num_slices = len(slice_offsets) - 1
    max_rank = lora_b.shape[1]
    if y.shape[0] == 0 or max_rank == 0 or num_slices == 0 or not segments.has_lora:
        return y
    assert shrunk.shape[0] == num_slices, "shrunk must hold one slice per slice_offsets interval"
    max_width = max(slice_offsets[i + 1] - slice_offsets[i] for i in range(num_slices))
    gemv = segments.max_seg_len <= GEMV_MAX_SEG
    if gemv:
        block_m = triton.next_power_of_2(max(segments.max_seg_len, 1))
        block_k = 16
        block_n = max(16, min(256, _GEMV_TILE_ELEMS // (block_m * block_k)))
    else:
        block_m = 32 if segments.max_seg_len <= 32 else 64
        block_k = 16
        block_n = 128
    block_n = min(block_n, max(16, triton.next_power_of_2(max_width)))
    m_tiles = triton.cdiv(segments.max_seg_len, block_m)
    grid = (segments.num_segments * m_tiles, triton.cdiv(max_width, block_n), num_slices)
    _sgmv_expand_kernel[grid](
        shrunk,
        lora_b,
        y,
        segments.seg_starts,
        segments.seg_slots,
        ranks,
        scales,
        _offsets_tensor(slice_offsets, y.device),
        m_tiles,
        *shrunk.stride(),
        *lora_b.stride(),
        y.stride(0),
        y.stride(1),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        USE_DOT=not gemv,
        PRECISE=dot_in_f32(lora_b.dtype, y.device),
    )
    return y
