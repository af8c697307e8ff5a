"""Plain-torch twins of every kernel op.

This is the CPU serving path AND the oracle the Triton kernels are tested against, so it favours
obvious correctness, computes in float32, and only vectorises where the obvious form is too slow to
serve with.

Shapes (shared with the Triton kernels; see ``kernels/__init__.py``):
  k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
  block_tables:     int32 [num_seqs, max_blocks_per_seq] (unused tail entries may hold anything >= 0)
  context_lens:     int32 [num_seqs], KV length of each sequence INCLUDING the tokens of this step
"""
from __future__ import annotations

import torch

from .lora_meta import LoraSegments


# --------------------------------------------------------------------------------------------- KV
def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store new keys/values: token t goes to flat slot ``slot_mapping[t]`` (= block * block_size +
    offset). Slots < 0 are padding and skipped."""
    num_blocks, block_size, h, d = k_cache.shape
    flat_k = k_cache.view(num_blocks * block_size, h, d)
    flat_v = v_cache.view(num_blocks * block_size, h, d)
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, k, v = slots[keep], k[keep], v[keep]
    flat_k.index_copy_(0, slots, k.to(k_cache.dtype))
    flat_v.index_copy_(0, slots, v.to(v_cache.dtype))


def _gather_seq_kv(cache: torch.Tensor, block_row: torch.Tensor, length: int) -> torch.Tensor:
    block_size = cache.shape[1]
    n_blocks = (length + block_size - 1) // block_size
    blocks = cache.index_select(0, block_row[:n_blocks].long())  # [n, bs, h, d]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:length]


# ------------------------------------------------------------------------------------- attention
def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence attending to its whole cached context.

    q: [num_seqs, num_q_heads, head_dim] -> out of the same shape and dtype.
    Vectorised over sequences: gathers every sequence's blocks into a padded tensor and masks the tail.
    """
    num_seqs, hq, d = q.shape
    if num_seqs == 0:
        return q.new_empty(q.shape)
    _, block_size, hkv, _ = k_cache.shape
    group = hq // hkv
    max_len = int(context_lens.max())
    n_blocks = (max_len + block_size - 1) // block_size
    table = block_tables[:, :n_blocks].long()
    k = k_cache[table].reshape(num_seqs, n_blocks * block_size, hkv, d).float()
    v = v_cache[table].reshape(num_seqs, n_blocks * block_size, hkv, d).float()
    qg = q.float().view(num_seqs, hkv, group, d)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    pos = torch.arange(n_blocks * block_size, device=q.device)
    mask = pos[None, :] >= context_lens.long()[:, None]  # [b, l]
    scores.masked_fill_(mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgl,blhd->bhgd", probs, v)
    return out.reshape(num_seqs, hq, d).to(q.dtype)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Variable-length query chunks attending causally to their cached prefix plus themselves.

    q: [total_query_tokens, num_q_heads, head_dim]; sequence ``s`` owns rows
    ``query_start_loc[s]:query_start_loc[s+1]``, which are the LAST ``query_len`` positions of its
    ``context_lens[s]`` tokens (their KV is already written to the cache). Query ``i`` of that chunk
    sits at position ``context_len - query_len + i`` and sees positions ``<=`` its own.
    """
    total, hq, d = q.shape
    out = torch.empty_like(q)
    hkv = k_cache.shape[2]
    group = hq // hkv
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for s in range(len(lens)):
        q0, q1 = starts[s], starts[s + 1]
        qlen, ctx = q1 - q0, lens[s]
        if qlen == 0:
            continue
        k = _gather_seq_kv(k_cache, block_tables[s], ctx).float()  # [ctx, hkv, d]
        v = _gather_seq_kv(v_cache, block_tables[s], ctx).float()
        qs = q[q0:q1].float().view(qlen, hkv, group, d)
        scores = torch.einsum("qhgd,khd->hgqk", qs, k) * scale
        q_pos = torch.arange(ctx - qlen, ctx, device=q.device)
        k_pos = torch.arange(ctx, device=q.device)
        causal = k_pos[None, :] > q_pos[:, None]  # [q, k]
        scores.masked_fill_(causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("hgqk,khd->qhgd", probs, v)
        out[q0:q1] = o.reshape(qlen, hq, d).to(q.dtype)
    return out


# ------------------------------------------------------------------------------------------ LoRA
def sgmv_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    segments: LoraSegments,
    ranks: torch.Tensor,
) -> torch.Tensor:
    """``out[i, t, :r] = x[t] @ lora_a[i, s, :r].T`` for every slice i and token t of slot s >= 0.

    x: [num_tokens, hidden_in]; lora_a: [num_slices, num_slots, max_rank, hidden_in];
    ranks: int32 [num_slots]. Returns float32 [num_slices, num_tokens, max_rank] (zeros where no
    adapter applies and beyond each slot's rank).
    """
    num_slices, _, max_rank, _ = lora_a.shape
    out = torch.zeros(num_slices, x.shape[0], max_rank, dtype=torch.float32, device=x.device)
    rank_list = ranks.tolist()
    starts = segments.starts_list
    for i, slot in enumerate(segments.slots_list):
        if slot < 0:
            continue
        r = rank_list[slot]
        t0, t1 = starts[i], starts[i + 1]
        out[:, t0:t1, :r] = torch.einsum("th,nrh->ntr", x[t0:t1].float(), lora_a[:, slot, :r].float())
    return out


def sgmv_expand(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    segments: LoraSegments,
    ranks: torch.Tensor,
    scales: torch.Tensor,
    slice_offsets: tuple[int, ...],
) -> torch.Tensor:
    """``y[t, off_i:off_{i+1}] += scale[s] * shrunk[i, t, :r] @ lora_b[s, :r, off_i:off_{i+1}]``.

    y: [num_tokens, total_out] (updated in place and returned); shrunk: [num_slices, num_tokens,
    max_rank]; lora_b: [num_slots, max_rank, total_out]; slice_offsets: num_slices + 1 column offsets.
    """
    rank_list = ranks.tolist()
    scale_list = scales.tolist()
    starts = segments.starts_list
    for i, slot in enumerate(segments.slots_list):
        if slot < 0:
            continue
        r = rank_list[slot]
        t0, t1 = starts[i], starts[i + 1]
        for n in range(len(slice_offsets) - 1):
            c0, c1 = slice_offsets[n], slice_offsets[n + 1]
            delta = shrunk[n, t0:t1, :r] @ lora_b[slot, :r, c0:c1].float()
            y[t0:t1, c0:c1] += (scale_list[slot] * delta).to(y.dtype)
    return y
