"""Triton paged prefill / extend attention: a chunk of new queries over the cached prefix + itself.

One program per (sequence, query tile, query head), online softmax over the cached prefix plus the
chunk itself; key tiles entirely left of the tile's first query skip the causal mask. Keys/values
are gathered through the block table (layout in ``triton_kv_write``). Softmax runs in base 2
(``exp2``, scale pre-multiplied by log2(e)); everything accumulates in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import LOG2E, dot, dot_in_f32


@triton.jit
def _prefill_inner(  # type: ignore[no-untyped-def]
    acc,
    m_i,
    l_i,
    q,
    kc_ptr,
    vc_ptr,
    bt_row_ptr,
    sbt_b,
    kv_head_off,
    sc_b,
    sc_p,
    sc_d,
    offs_d,
    d_mask,
    q_pos,
    lo,
    hi,
    ctx,
    sm_scale_log2,
    BLOCK_N: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISE: tl.constexpr,
):
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < ctx
        blk = tl.load(bt_row_ptr + (offs_n // KV_BLOCK) * sbt_b, mask=n_mask, other=0)
        row = blk.to(tl.int64) * sc_b + (offs_n % KV_BLOCK) * sc_p + kv_head_off
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(kc_ptr + row[:, None] + offs_d[None, :] * sc_d, mask=kv_mask, other=0.0)
        v = tl.load(vc_ptr + row[:, None] + offs_d[None, :] * sc_d, mask=kv_mask, other=0.0)
        s = dot(q, tl.trans(k), PRECISE) * sm_scale_log2
        if CAUSAL:
            s = tl.where((offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISE)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _prefill_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    qsl_ptr,
    ctx_ptr,
    out_ptr,
    sm_scale_log2,
    head_dim,
    sq_t,
    sq_h,
    sq_d,
    sc_b,
    sc_p,
    sc_h,
    sc_d,
    sbt_s,
    sbt_b,
    so_t,
    so_h,
    so_d,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    PRECISE: tl.constexpr,
):
    seq = tl.program_id(0)
    m_tile = tl.program_id(1)
    head = tl.program_id(2)
    q0 = tl.load(qsl_ptr + seq)
    qlen = tl.load(qsl_ptr + seq + 1) - q0
    m_start = m_tile * BLOCK_M
    if m_start < qlen:
        ctx = tl.load(ctx_ptr + seq)
        prefix = ctx - qlen
        offs_m = m_start + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < qlen
        d_mask = offs_d < head_dim
        q_pos = prefix + offs_m
        rows = (q0 + offs_m).to(tl.int64)
        q = tl.load(
            q_ptr + rows[:, None] * sq_t + head * sq_h + offs_d[None, :] * sq_d,
            mask=m_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        bt_row = bt_ptr + seq * sbt_s
        kv_head_off = (head // GROUP) * sc_h
        # Keys left of the tile's first query are visible to every row: no causal mask there.
        # Every row sees key 0, so the first tile (masked or not) leaves m_i finite.
        full_end = ((prefix + m_start) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(ctx, prefix + m_start + BLOCK_M)
        acc, m_i, l_i = _prefill_inner(
            acc,
            m_i,
            l_i,
            q,
            kc_ptr,
            vc_ptr,
            bt_row,
            sbt_b,
            kv_head_off,
            sc_b,
            sc_p,
            sc_d,
            offs_d,
            d_mask,
            q_pos,
            0,
            full_end,
            ctx,
            sm_scale_log2,
            BLOCK_N=BLOCK_N,
            KV_BLOCK=KV_BLOCK,
            CAUSAL=False,
            PRECISE=PRECISE,
        )
        acc, m_i, l_i = _prefill_inner(
            acc,
            m_i,
            l_i,
            q,
            kc_ptr,
            vc_ptr,
            bt_row,
            sbt_b,
            kv_head_off,
            sc_b,
            sc_p,
            sc_d,
            offs_d,
            d_mask,
            q_pos,
            full_end,
            hi,
            ctx,
            sm_scale_log2,
            BLOCK_N=BLOCK_N,
            KV_BLOCK=KV_BLOCK,
            CAUSAL=True,
            PRECISE=PRECISE,
        )
        o = acc / l_i[:, None]
        tl.store(
            out_ptr + rows[:, None] * so_t + head * so_h + offs_d[None, :] * so_d,
            o.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None] & d_mask[None, :],
        )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """Same contract as ``reference.paged_prefill_attention``. Pass ``max_query_len`` (the longest
    chunk this step, known to the scheduler) to avoid one host sync that sizes the grid."""
    total, num_q_heads, head_dim = q.shape
    out = torch.empty_like(q)
    num_seqs = context_lens.shape[0]
    if total == 0 or num_seqs == 0:
        return out
    _, kv_block, num_kv_heads, _ = k_cache.shape
    assert k_cache.stride() == v_cache.stride(), "k and v caches must share a layout"
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if max_query_len <= 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    block_m = 64 if block_d <= 64 else 32
    block_m = min(block_m, max(16, triton.next_power_of_2(max_query_len)))
    block_n = 64 if block_d <= 64 else 32
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), num_q_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        context_lens,
        out,
        scale * LOG2E,
        head_dim,
        *q.stride(),
        *k_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        GROUP=num_q_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        KV_BLOCK=kv_block,
        PRECISE=dot_in_f32(q.dtype, q.device),
    )
    return out


__all__ = ["paged_prefill_attention"]
