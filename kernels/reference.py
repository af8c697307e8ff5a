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
import torch.nn.functional as F

from .lora_meta import LoraSegments
from .ops import replaced_weight


# ---------------------------------------------------------------------------------- element-wise
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm: normalise in float32, cast back to ``x``'s dtype, scale by ``weight``."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of a fused [T, 2n] gate|up projection."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# --------------------------------------------------------------------------------------------- KV
def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The reference keeps no second copy of a weight: ``linear`` reads ``weight`` itself."""
    return None


def linear(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, packed: torch.Tensor | None
) -> torch.Tensor:
    """``x @ weight.T + bias``; ``packed`` (a backend's own copy of ``weight``, from its
    ``pack_linear_weight``) is a layout of the same numbers, so the reference ignores it unless the
    copy replaced the weight (an opaque oneDNN tensor or pair panels: read back)."""
    if weight is None:
        assert packed is not None, "linear needs a weight or a packed copy that replaced it"
        weight = replaced_weight(packed)
    return F.linear(x, weight, bias)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` [T, heads, D] with ``cos``/``sin`` [T, 1, D/2] (q and k heads may
    come as one tensor: one pass for both). In ``x``'s dtype, rounding after each op."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


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
    Vectorised over sequences: each group of sequences with similar context lengths (power-of-two
    block counts) is gathered into one padded tensor with the tail masked, so one long context
    does not make the whole batch pay for its length.
    """
    num_seqs = q.shape[0]
    if num_seqs == 0:
        return q.new_empty(q.shape)
    block_size = k_cache.shape[1]
    groups: dict[int, list[int]] = {}
    for i, length in enumerate(context_lens.tolist()):
        blocks = (length + block_size - 1) // block_size
        groups.setdefault(1 << max(0, blocks - 1).bit_length(), []).append(i)
    if len(groups) == 1:
        return _decode_padded(q, k_cache, v_cache, block_tables, context_lens, scale)
    out = torch.empty_like(q)
    for idx in groups.values():
        rows = torch.tensor(idx, dtype=torch.long, device=q.device)
        out[rows] = _decode_padded(q[rows], k_cache, v_cache, block_tables[rows], context_lens[rows], scale)
    return out


def _decode_padded(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    num_seqs, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    group = hq // hkv
    max_len = int(context_lens.max())
    n_blocks = (max_len + block_size - 1) // block_size
    table = block_tables[:, :n_blocks].reshape(-1).long()
    # bf16 runs natively (SDPA accumulates in fp32 on CPU); fp16 is upcast, CPU fp16 kernels are poor.
    cdt = q.dtype if q.dtype in (torch.float32, torch.bfloat16) else torch.float32
    k = k_cache.index_select(0, table).view(num_seqs, n_blocks * block_size, hkv, d).transpose(1, 2).to(cdt)
    v = v_cache.index_select(0, table).view(num_seqs, n_blocks * block_size, hkv, d).transpose(1, 2).to(cdt)
    pos = torch.arange(n_blocks * block_size, device=q.device)
    visible = (pos[None, :] < context_lens.long()[:, None])[:, None, None, :]  # [b, 1, 1, l]
    # GQA without repeating K/V: the `group` query heads sharing a KV head are the query rows.
    qg = q.to(cdt).view(num_seqs, hkv, group, d)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=visible, scale=scale)
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
    cdt = q.dtype if q.dtype in (torch.float32, torch.bfloat16) else torch.float32
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    for s in range(len(lens)):
        q0, q1 = starts[s], starts[s + 1]
        qlen, ctx = q1 - q0, lens[s]
        if qlen == 0:
            continue
        k = _gather_seq_kv(k_cache, block_tables[s], ctx).to(cdt).transpose(0, 1)  # [hkv, ctx, d]
        v = _gather_seq_kv(v_cache, block_tables[s], ctx).to(cdt).transpose(0, 1)
        # GQA without repeating K/V: row (i, g) of KV head h is query token i of head h*group + g.
        qs = q[q0:q1].to(cdt).view(qlen, hkv, group, d).permute(1, 0, 2, 3).reshape(hkv, qlen * group, d)
        q_pos = torch.arange(ctx - qlen, ctx, device=q.device).repeat_interleave(group)
        visible = torch.arange(ctx, device=q.device)[None, :] <= q_pos[:, None]  # [qlen*group, ctx]
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=visible, scale=scale)
        out[q0:q1] = o.view(hkv, qlen, group, d).permute(1, 0, 2, 3).reshape(qlen, hq, d).to(q.dtype)
    return out


# ------------------------------------------------------------------------------------------ LoRA
# Serving path. Segments of at most ``_GATHER_MAX_SEG`` tokens (decode) are handled together: each
# token's own adapter weights are gathered (``index_select``) and applied with one broadcast
# multiply-sum. Longer segments (prefill chunks) get one matmul each. A Python loop per segment
# costs ~15 us per small matmul (x slices x segments, 4x per layer), which dominates a decode step
# over many adapters on CPU; the gather copies weights, so it is used only while one token's
# weights are small (measured break-even on 2 cores: ~150 KB per token).
_GATHER_MAX_SEG = 4
_GATHER_MAX_BYTES = 128 * 1024


class _SgmvPlan:
    """How one step's segments split between the gather path and per-segment matmuls. Depends only
    on the segments, which every LoRA layer of the step shares, so it is memoised on them."""

    __slots__ = ("long", "short", "short_idx", "short_slots", "short_slot_set")

    def __init__(self, segments: LoraSegments, device: torch.device):
        starts = segments.starts_list
        self.long: list[tuple[int, int, int]] = []
        self.short: list[tuple[int, int, int]] = []
        idx: list[int] = []
        slots: list[int] = []
        for i, slot in enumerate(segments.slots_list):
            t0, t1 = starts[i], starts[i + 1]
            if slot < 0:
                continue
            if t1 - t0 > _GATHER_MAX_SEG:
                self.long.append((t0, t1, slot))
            else:
                self.short.append((t0, t1, slot))
                idx.extend(range(t0, t1))
                slots.extend([slot] * (t1 - t0))
        self.short_slot_set = frozenset(slots)
        self.short_idx = torch.tensor(idx, dtype=torch.long, device=device)
        self.short_slots = torch.tensor(slots, dtype=torch.long, device=device)


def _plan(segments: LoraSegments, device: torch.device) -> _SgmvPlan:
    plan = segments.__dict__.get("_ref_sgmv_plan")
    if plan is None or plan.short_idx.device != device:
        plan = _SgmvPlan(segments, device)
        object.__setattr__(segments, "_ref_sgmv_plan", plan)  # private memo on a frozen dataclass
    return plan


def _gather_rank(plan: _SgmvPlan, ranks: torch.Tensor, rank_list: list[int]) -> tuple[int, torch.Tensor | None]:
    """Largest rank among gathered tokens and a [n, r_eff] mask of each token's own rank (None when
    all share it), so padding rows beyond a slot's rank never contribute."""
    r_eff = max(rank_list[s] for s in plan.short_slot_set)
    if all(rank_list[s] == r_eff for s in plan.short_slot_set):
        return r_eff, None
    tok_rank = ranks.to(plan.short_slots.device).long().index_select(0, plan.short_slots)
    return r_eff, torch.arange(r_eff, device=tok_rank.device)[None, :] < tok_rank[:, None]


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
    num_slices, _, max_rank, hidden = lora_a.shape
    out = torch.zeros(num_slices, x.shape[0], max_rank, dtype=torch.float32, device=x.device)
    if not segments.has_lora:
        return out
    rank_list = ranks.tolist()
    plan = _plan(segments, x.device)
    segs = plan.long
    if plan.short:
        r_eff, mask = _gather_rank(plan, ranks, rank_list)
        if num_slices * r_eff * hidden * 4 > _GATHER_MAX_BYTES:
            segs = plan.long + plan.short
        elif r_eff > 0:
            w = lora_a[:, :, :r_eff].index_select(1, plan.short_slots).float()  # [slices, n, r, h]
            xs = x.index_select(0, plan.short_idx).float()  # [n, h]
            res = (w * xs[None, :, None, :]).sum(-1)  # [slices, n, r]
            if mask is not None:
                res = res * mask
            out[:, plan.short_idx, :r_eff] = res
    for t0, t1, slot in segs:
        r = rank_list[slot]
        out[:, t0:t1, :r] = torch.matmul(x[t0:t1].float(), lora_a[:, slot, :r].float().transpose(1, 2))
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
    if not segments.has_lora:
        return y
    rank_list = ranks.tolist()
    scale_list = scales.tolist()
    plan = _plan(segments, y.device)
    num_slices = len(slice_offsets) - 1
    c_lo, c_hi = slice_offsets[0], slice_offsets[-1]
    segs = plan.long
    if plan.short:
        r_eff, mask = _gather_rank(plan, ranks, rank_list)
        if r_eff * (c_hi - c_lo) * 4 > _GATHER_MAX_BYTES:
            segs = plan.long + plan.short
        elif r_eff > 0:
            idx = plan.short_idx
            w = lora_b[:, :r_eff, c_lo:c_hi].index_select(0, plan.short_slots).float()  # [n, r, out]
            s = shrunk[:, :, :r_eff].index_select(1, idx).float()  # [slices, n, r]
            if mask is not None:
                s = s * mask
            tok_scale = scales.to(y.device).float().index_select(0, plan.short_slots)[:, None]
            for n in range(num_slices):
                c0, c1 = slice_offsets[n] - c_lo, slice_offsets[n + 1] - c_lo
                delta = (s[n][:, :, None] * w[:, :, c0:c1]).sum(1)  # [n, width]
                y[idx, c0 + c_lo : c1 + c_lo] += (tok_scale * delta).to(y.dtype)
    for t0, t1, slot in segs:
        r = rank_list[slot]
        for n in range(num_slices):
            c0, c1 = slice_offsets[n], slice_offsets[n + 1]
            delta = shrunk[n, t0:t1, :r].float() @ lora_b[slot, :r, c0:c1].float()
            y[t0:t1, c0:c1] += (scale_list[slot] * delta).to(y.dtype)
    return y


# Obvious one-matmul-per-segment versions: the yardstick the serving path above is tested against.
def _sgmv_shrink_naive(
    x: torch.Tensor, lora_a: torch.Tensor, segments: LoraSegments, ranks: torch.Tensor
) -> torch.Tensor:
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


def _sgmv_expand_naive(
    y: torch.Tensor,
    shrunk: torch.Tensor,
    lora_b: torch.Tensor,
    segments: LoraSegments,
    ranks: torch.Tensor,
    scales: torch.Tensor,
    slice_offsets: tuple[int, ...],
) -> torch.Tensor:
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
            delta = shrunk[n, t0:t1, :r].float() @ lora_b[slot, :r, c0:c1].float()
            y[t0:t1, c0:c1] += (scale_list[slot] * delta).to(y.dtype)
    return y
