"""Triton paged attention: KV write, decode (split-KV / flash-decoding) and prefill/extend.

Cache layout (shared with ``reference``): ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A token at logical position ``p`` of sequence ``s`` lives in physical block
``block_tables[s, p // block_size]`` at row ``p % block_size``. Kernels gather keys/values token
by token from that mapping, so any block size works with any tile size.

Decode: one program per (sequence, kv head, KV split). All query heads of one GQA group are one
tile (padded to 16 rows for ``tl.dot``), so each key/value is read once per group, not per head.
Long contexts are cut into partitions processed by separate programs that each write a normalised
partial output plus its log-sum-exp; a second small kernel merges the partials. With one
partition the first kernel writes the output directly.

Prefill/extend: one program per (sequence, query tile, query head), online softmax over the cached
prefix plus the chunk itself; key tiles entirely left of the tile's first query skip the causal mask.

Softmax runs in base 2 (``exp2``, scale pre-multiplied by log2(e)); everything accumulates in fp32.
No kernel here syncs with the host unless asked for sizes it cannot bound from tensor shapes.
A sequence with ``context_len == 0`` gets a zero output (the reference would give NaN).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import device_sm_count, dot, dot_in_f32

_LOG2E = 1.4426950408889634


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return device_sm_count(device)
    return 4


# --------------------------------------------------------------------------------------- write_kv
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


# ----------------------------------------------------------------------------------------- decode
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
        scale * _LOG2E,
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


# ---------------------------------------------------------------------------------------- prefill
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
        scale * _LOG2E,
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


__all__ = ["write_kv", "paged_decode_attention", "paged_prefill_attention"]
