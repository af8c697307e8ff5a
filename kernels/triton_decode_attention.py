"""Triton paged decode attention: split-KV (flash-decoding) partials, then a reduce.

One program per (sequence, kv head, KV split). All query heads of one GQA group are one tile
(padded to 16 rows for ``tl.dot``), so each key/value is read once per group, not per head. Long
contexts are cut into partitions processed by separate programs that each write a normalised
partial output plus its log-sum-exp; a second small kernel merges the partials. With one
partition the first kernel writes the output directly.

Keys/values are gathered token by token through the block table (layout in ``triton_kv_write``),
so any block size works with any tile size. Softmax runs in base 2 (``exp2``, scale pre-multiplied
by log2(e)); everything accumulates in fp32. Nothing syncs with the host unless asked for sizes it
cannot bound from tensor shapes. A sequence with ``context_len == 0`` gets a zero output (the
reference would give NaN).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import LOG2E, device_sm_count, dot, dot_in_f32


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return device_sm_count(device)
    return 4


@triton.jit
def _decode_split_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    ctx_ptr,
    out_ptr,
    po_ptr,
    plse_ptr,
    sm_scale_log2,
    partition_size,
    head_dim,
    sq_s,
    sq_h,
    sq_d,
    sc_b,
    sc_p,
    sc_h,
    sc_d,
    sbt_s,
    sbt_b,
    so_s,
    so_h,
    so_d,
    spo_s,
    spo_h,
    spo_p,
    spo_d,
    splse_s,
    splse_h,
    splse_p,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    ONE_SPLIT: tl.constexpr,
    PRECISE: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + seq)
    start = split * partition_size
    end = tl.minimum(ctx, start + partition_size)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < head_dim
    if start < end:
        q = tl.load(
            q_ptr + seq * sq_s + heads[:, None] * sq_h + offs_d[None, :] * sq_d,
            mask=g_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n < end
            blk = tl.load(bt_ptr + seq * sbt_s + (offs_n // KV_BLOCK) * sbt_b, mask=n_mask, other=0)
            row = blk.to(tl.int64) * sc_b + (offs_n % KV_BLOCK) * sc_p + kvh * sc_h
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(kc_ptr + row[:, None] + offs_d[None, :] * sc_d, mask=kv_mask, other=0.0)
            v = tl.load(vc_ptr + row[:, None] + offs_d[None, :] * sc_d, mask=kv_mask, other=0.0)
            s = dot(q, tl.trans(k), PRECISE)
            s = tl.where(n_mask[None, :], s * sm_scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: every chunk has a valid key
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISE)
            m_i = m_new
        o = acc / l_i[:, None]
        if ONE_SPLIT:
            tl.store(
                out_ptr + seq * so_s + heads[:, None] * so_h + offs_d[None, :] * so_d,
                o.to(out_ptr.dtype.element_ty),
                mask=g_mask[:, None] & d_mask[None, :],
            )
        else:
            tl.store(
                po_ptr + seq * spo_s + heads[:, None] * spo_h + split * spo_p + offs_d[None, :] * spo_d,
                o,
                mask=g_mask[:, None] & d_mask[None, :],
            )
            tl.store(plse_ptr + seq * splse_s + heads * splse_h + split * splse_p, m_i + tl.log2(l_i), mask=g_mask)
    elif ONE_SPLIT:  # empty sequence
        tl.store(
            out_ptr + seq * so_s + heads[:, None] * so_h + offs_d[None, :] * so_d,
            tl.zeros((BLOCK_G, BLOCK_D), dtype=out_ptr.dtype.element_ty),
            mask=g_mask[:, None] & d_mask[None, :],
        )


@triton.jit
def _decode_reduce_kernel(  # type: ignore[no-untyped-def]
    po_ptr,
    plse_ptr,
    ctx_ptr,
    out_ptr,
    partition_size,
    head_dim,
    spo_s,
    spo_h,
    spo_p,
    spo_d,
    splse_s,
    splse_h,
    splse_p,
    so_s,
    so_h,
    so_d,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    ctx = tl.load(ctx_ptr + seq)
    n_parts = tl.cdiv(ctx, partition_size)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    m = float("-inf")
    l = 0.0
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for p in range(0, n_parts):
        lse = tl.load(plse_ptr + seq * splse_s + head * splse_h + p * splse_p)
        o = tl.load(po_ptr + seq * spo_s + head * spo_h + p * spo_p + offs_d * spo_d, mask=d_mask, other=0.0)
        m_new = tl.maximum(m, lse)
        a = tl.exp2(m - m_new)
        b = tl.exp2(lse - m_new)
        acc = acc * a + o * b
        l = l * a + b
        m = m_new
    res = tl.where(l > 0, acc / tl.maximum(l, 1e-30), 0.0)
    tl.store(out_ptr + seq * so_s + head * so_h + offs_d * so_d, res.to(out_ptr.dtype.element_ty), mask=d_mask)


def _decode_partition(
    num_seqs: int, num_kv_heads: int, max_ctx: int, block_d: int, device: torch.device, partition_size: int | None
) -> tuple[int, int, int]:
    """(BLOCK_N, partition_size, num_splits) for a decode launch."""
    block_n = 64 if block_d <= 128 else 32
    max_ctx = max(max_ctx, 1)
    if partition_size is None:
        # Enough (seq, kv head, split) programs for ~2 waves; no split shorter than 256 keys.
        want = triton.cdiv(2 * _num_sms(device), num_seqs * num_kv_heads)
        splits = max(1, min(want, triton.cdiv(max_ctx, 256)))
        partition_size = triton.cdiv(max_ctx, splits)
    else:  # an explicit (small) partition also shrinks the key tile, down to tl.dot's minimum 16
        block_n = max(16, min(block_n, triton.next_power_of_2(int(partition_size))))
    partition_size = triton.cdiv(max(int(partition_size), 1), block_n) * block_n
    return block_n, partition_size, triton.cdiv(max_ctx, partition_size)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    max_context_len: int | None = None,
    partition_size: int | None = None,
) -> torch.Tensor:
    """Same contract as ``reference.paged_decode_attention``.

    ``max_context_len`` bounds the split count; by default ``block_tables.shape[1] * block_size``
    (no host sync). ``partition_size`` (tokens per KV split, rounded up to the key tile) overrides
    the automatic choice, mainly for tests.
    """
    num_seqs, num_q_heads, head_dim = q.shape
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    _, kv_block, num_kv_heads, _ = k_cache.shape
    assert k_cache.stride() == v_cache.stride(), "k and v caches must share a layout"
    group = num_q_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    block_g = max(16, triton.next_power_of_2(group))
    max_ctx = max_context_len if max_context_len is not None else block_tables.shape[1] * kv_block
    block_n, partition_size, splits = _decode_partition(
        num_seqs, num_kv_heads, int(max_ctx), block_d, q.device, partition_size
    )
    one = splits == 1
    if one:
        part_o = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(1, 1, 1, dtype=torch.float32, device=q.device)
    else:
        part_o = torch.empty(num_seqs, num_q_heads, splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, num_q_heads, splits, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(num_seqs, num_kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_o,
        part_lse,
        scale * LOG2E,
        partition_size,
        head_dim,
        *q.stride(),
        *k_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        *part_o.stride(),
        *part_lse.stride(),
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        KV_BLOCK=kv_block,
        ONE_SPLIT=one,
        PRECISE=dot_in_f32(q.dtype, q.device),
    )
    if not one:
        _decode_reduce_kernel[(num_seqs, num_q_heads)](
            part_o,
            part_lse,
            context_lens,
            out,
            partition_size,
            head_dim,
            *part_o.stride(),
            *part_lse.stride(),
            *out.stride(),
            BLOCK_D=block_d,
        )
    return out


__all__ = ["paged_decode_attention"]
