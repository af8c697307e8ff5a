"""Independent oracles and case builders for the kernel tests (float64, one token at a time,
written from the op definitions, sharing no code with ``kernels/reference.py``)."""

from __future__ import annotations

import math

import torch

# Tolerance on max|error| / max|oracle| by input dtype. fp32 inputs: only summation-order error
# (~1e-7 per add over a few hundred terms). fp16 (10-bit mantissa, unit roundoff 4.9e-4) and bf16
# (7-bit, 3.9e-3): outputs are rounded to the dtype once and some kernels round one fp32
# intermediate (shrunk activations, softmax probabilities) to it before a tensor-core dot: ~2-3
# roundoffs of headroom.
REL_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_close_scaled(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = ""):
    actual = actual.double()
    expected = expected.double()
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), f"{what}: non-finite values (unwritten output?)"
    scale = max(float(expected.abs().max()), 1e-6)
    err = float((actual - expected).abs().max())
    assert err <= REL_TOL[dtype] * scale, f"{what}: max err {err:.3g} > {REL_TOL[dtype]:.1g} * {scale:.3g}"


# ------------------------------------------------------------------------------------------- SGMV
def token_slots_from_segments(segs: list[tuple[int, int]]) -> list[int]:
    """[(slot, length), ...] -> per-token slot list."""
    out: list[int] = []
    for slot, length in segs:
        out.extend([slot] * length)
    return out


def make_lora_weights(num_slots, ranks, hidden, widths, dtype, seed=0, padding=1e3):
    """Stacked A/B like the LoRA manager builds them, except that rows beyond each slot's rank hold
    ``padding`` instead of zeros: an op that reads past a slot's rank shows up as a huge error."""
    g = torch.Generator().manual_seed(seed)
    max_rank = max(ranks)
    num_slices = len(widths)
    offsets = [0]
    for w in widths:
        offsets.append(offsets[-1] + w)
    a = torch.randn(num_slices, num_slots, max_rank, hidden, generator=g) / math.sqrt(hidden)
    b = torch.randn(num_slots, max_rank, offsets[-1], generator=g) / math.sqrt(max_rank)
    for s, r in enumerate(ranks):
        a[:, s, r:] = padding
        b[s, r:] = padding
    scales = torch.rand(num_slots, generator=g) + 0.5
    return a.to(dtype), b.to(dtype), torch.tensor(ranks, dtype=torch.int32), scales, tuple(offsets)


# SGMV cases of the reference/Triton tests and the native CPU tests:
# name -> (segments [(slot, length)], ranks per slot, hidden, slice widths)
SGMV_CASES = {
    # decode: 1-token segments over many adapters, mixed ranks 1..64, fused q|k|v widths, slot -1.
    "decode_qkv": (
        [(0, 1), (1, 1), (2, 1), (-1, 2), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1)],
        [1, 64, 8, 16, 0, 33, 64, 2],
        72,
        [48, 16, 16],
    ),  # slot 4: rank 0 (layer not targeted)
    # 32 adapters one token each, single slice, hidden not a power of two.
    "decode_32_adapters": ([(s, 1) for s in range(32)], [1 + (7 * s) % 64 for s in range(32)], 40, [24]),
    # prefill-sized segments (long runs) with gate|up, a -1 run in the middle, rank 1 and 64.
    "prefill_gate_up": ([(0, 37), (-1, 5), (1, 3), (2, 20)], [64, 1, 9], 100, [40, 40]),
    # mixture: long and short runs of the same slot, adapter order not sorted.
    "mixed": ([(2, 1), (0, 18), (1, 2), (2, 9), (-1, 1), (0, 1)], [5, 16, 64], 33, [20, 12, 12]),
}


def garbage_beyond_rank(shrunk, token_slots, ranks):
    """Expand must read only the first ``rank`` columns of each token's shrunk activations."""
    g = shrunk.clone()
    for t, s in enumerate(token_slots):
        g[:, t, (int(ranks[s]) if s >= 0 else 0) :] = 7.0
    return g


def check_untouched_rows(y_after, y_before, token_slots):
    for t, s in enumerate(token_slots):
        if s < 0:
            assert torch.equal(y_after[t], y_before[t]), f"token {t} (slot -1) was modified"


def oracle_shrink(x, lora_a, token_slots, ranks):
    num_slices, _, max_rank, _ = lora_a.shape
    out = torch.zeros(num_slices, x.shape[0], max_rank, dtype=torch.float64)
    for t, s in enumerate(token_slots):
        if s < 0:
            continue
        r = int(ranks[s])
        for i in range(num_slices):
            out[i, t, :r] = lora_a[i, s, :r].double() @ x[t].double()
    return out


def oracle_expand(y, shrunk, lora_b, token_slots, ranks, scales, offsets):
    out = y.double().clone()
    for t, s in enumerate(token_slots):
        if s < 0:
            continue
        r = int(ranks[s])
        for i in range(len(offsets) - 1):
            c0, c1 = offsets[i], offsets[i + 1]
            out[t, c0:c1] += float(scales[s]) * (shrunk[i, t, :r].double() @ lora_b[s, :r, c0:c1].double())
    return out


# -------------------------------------------------------------------------------------- attention
class PagedKV:
    """Per-sequence K/V in logical order, scattered into a paged cache through a shuffled block
    table (so physical order differs from logical order). Unused cache rows hold garbage."""

    def __init__(self, ctx_lens, block_size, num_kv_heads, head_dim, dtype, seed=0, spare_blocks=3):
        g = torch.Generator().manual_seed(seed)
        self.ctx_lens = list(ctx_lens)
        self.block_size = block_size
        n_blocks = [math.ceil(c / block_size) for c in ctx_lens]
        total = sum(n_blocks) + spare_blocks
        self.k_cache = (torch.randn(total, block_size, num_kv_heads, head_dim, generator=g) * 50).to(dtype)
        self.v_cache = (torch.randn(total, block_size, num_kv_heads, head_dim, generator=g) * 50).to(dtype)
        perm = torch.randperm(total, generator=g).tolist()
        width = max(n_blocks) + 1  # one spare column: entries beyond a sequence's blocks are unused
        self.block_tables = torch.zeros(len(ctx_lens), width, dtype=torch.int32)
        self.keys, self.values = [], []
        for s, c in enumerate(ctx_lens):
            row = [perm.pop() for _ in range(n_blocks[s])]
            self.block_tables[s, : len(row)] = torch.tensor(row, dtype=torch.int32)
            self.block_tables[s, len(row) :] = perm[0]  # valid but foreign block
            k = torch.randn(c, num_kv_heads, head_dim, generator=g).to(dtype)
            v = torch.randn(c, num_kv_heads, head_dim, generator=g).to(dtype)
            for p in range(c):
                self.k_cache[row[p // block_size], p % block_size] = k[p]
                self.v_cache[row[p // block_size], p % block_size] = v[p]
            self.keys.append(k)
            self.values.append(v)
        self.context_lens = torch.tensor(ctx_lens, dtype=torch.int32)


def oracle_attention(q_rows, keys, values, ctx_len, scale):
    """Dense causal attention in float64 for one sequence: q_rows [n, hq, d] are the last n
    positions of a context of ctx_len tokens; keys/values [ctx_len, hkv, d]."""
    n, hq, d = q_rows.shape
    hkv = keys.shape[1]
    group = hq // hkv
    k = keys.double().repeat_interleave(group, dim=1)  # [ctx, hq, d]
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,khd->hnk", q_rows.double(), k) * scale
    q_pos = torch.arange(ctx_len - n, ctx_len)
    k_pos = torch.arange(ctx_len)
    scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.einsum("hnk,khd->nhd", torch.softmax(scores, dim=-1), v)


# ------------------------------------------------------------------ paged attention cases
# (block_size, num_q_heads, num_kv_heads, head_dim, dtype): covers block 8/16/32, GQA 1/4/8,
# head dim 64/128 and the three dtypes without the full product (the interpreter is slow).
ATTENTION_CONFIGS = [
    (16, 4, 4, 64, torch.float32),
    (8, 8, 2, 64, torch.bfloat16),
    (32, 8, 1, 128, torch.float16),
    (16, 8, 1, 64, torch.bfloat16),
    (8, 4, 1, 128, torch.float32),
    (32, 8, 2, 64, torch.bfloat16),
    (16, 2, 2, 128, torch.float16),
]


def attention_config_id(cfg):
    bs, hq, hkv, d, dt = cfg
    return f"bs{bs}-g{hq // hkv}-d{d}-{str(dt).split('.')[-1]}"


def decode_context_lens(bs):
    # 1 token, partial first block, exactly one block, one past, several blocks with partial tail.
    return [1, bs - 3, bs, bs + 1, 3 * bs + 5, 5 * bs]


def decode_expected(kv, q, scale):
    return torch.cat(
        [oracle_attention(q[s : s + 1], kv.keys[s], kv.values[s], c, scale) for s, c in enumerate(kv.ctx_lens)]
    )


def prefill_layout(bs):
    """(query_len, context_len) per sequence: no prefix, cached prefix with partial blocks, a
    1-token chunk (decode through the prefill kernel), a sequence with no query this step, chunk
    shorter than a block."""
    return [(bs + 5, bs + 5), (7, 2 * bs + 7), (1, bs + 2), (0, bs), (3, 3), (bs + 2, 3 * bs)]


def prefill_case(cfg, seed):
    bs, hq, hkv, d, dtype = cfg
    layout = prefill_layout(bs)
    kv = PagedKV([c for _, c in layout], bs, hkv, d, dtype, seed=seed)
    qsl = [0]
    for n, _ in layout:
        qsl.append(qsl[-1] + n)
    q = torch.randn(qsl[-1], hq, d).to(dtype)
    scale = 1 / math.sqrt(d)
    expected = torch.cat(
        [
            oracle_attention(q[qsl[s] : qsl[s + 1]], kv.keys[s], kv.values[s], c, scale)
            for s, (_, c) in enumerate(layout)
        ]
    )
    return kv, q, torch.tensor(qsl, dtype=torch.int32), scale, expected
