"""SGMV shrink/expand: the torch reference (serving path and naive twin) against a float64
per-token oracle, then the Triton kernels (interpreter on CPU) against the same oracle."""

from __future__ import annotations

import pytest
import torch
from kernel_oracles import SGMV_CASES as CASES
from kernel_oracles import (
    assert_close_scaled,
    check_untouched_rows,
    garbage_beyond_rank,
    make_lora_weights,
    oracle_expand,
    oracle_shrink,
    token_slots_from_segments,
)

from loraplex.kernels import make_lora_segments, reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _build(case, dtype, seed=0):
    segs, ranks, hidden, widths = CASES[case]
    token_slots = token_slots_from_segments(segs)
    a, b, ranks_t, scales, offsets = make_lora_weights(len(ranks), ranks, hidden, widths, dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(len(token_slots), hidden, generator=g).to(dtype)
    y = torch.randn(len(token_slots), offsets[-1], generator=g).to(dtype)
    return token_slots, make_lora_segments(token_slots), x, y, a, b, ranks_t, scales, offsets


# ------------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("path", ["serving", "serving_loop", "naive"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_reference_sgmv_matches_oracle(case, dtype, path, monkeypatch):
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build(case, dtype)
    if path == "serving_loop":  # force the per-segment matmul fallback of the serving path
        monkeypatch.setattr(reference, "_GATHER_MAX_BYTES", 0)
    shrink = reference._sgmv_shrink_naive if path == "naive" else reference.sgmv_shrink
    expand = reference._sgmv_expand_naive if path == "naive" else reference.sgmv_expand

    shrunk = shrink(x, a, seg, ranks)
    assert shrunk.dtype == torch.float32
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "shrink")

    shrunk = garbage_beyond_rank(shrunk, token_slots, ranks)
    y_out = expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)
    assert y_out.dtype == dtype
    assert_close_scaled(y_out, oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets), dtype, "expand")
    check_untouched_rows(y_out, y, token_slots)


def test_reference_rank_mask_ignores_nonzero_padding():
    """The serving path must honour ranks even if padding rows beyond a rank are not zero."""
    token_slots = [0, 1, 2, 1]
    seg = make_lora_segments(token_slots)
    a = torch.randn(1, 3, 8, 16)
    b = torch.randn(3, 8, 10)
    ranks = torch.tensor([2, 8, 5], dtype=torch.int32)
    x = torch.randn(4, 16)
    fast = reference.sgmv_shrink(x, a, seg, ranks)
    assert torch.allclose(fast, oracle_shrink(x, a, token_slots, ranks).float(), atol=1e-5)
    y = torch.zeros(4, 10)
    out = reference.sgmv_expand(y.clone(), fast + 1.0, b, seg, ranks, torch.ones(3), (0, 10))
    assert torch.allclose(
        out, oracle_expand(y, fast + 1.0, b, token_slots, ranks, torch.ones(3), (0, 10)).float(), atol=1e-4
    )


def test_reference_no_adapter_tokens_only():
    seg = make_lora_segments([-1, -1, -1])
    a, b, ranks, scales, offsets = make_lora_weights(2, [4, 8], 16, [8, 8], torch.float32)
    x, y = torch.randn(3, 16), torch.randn(3, 16)
    assert torch.count_nonzero(reference.sgmv_shrink(x, a, seg, ranks)) == 0
    assert torch.equal(reference.sgmv_expand(y.clone(), torch.randn(2, 3, 8), b, seg, ranks, scales, offsets), y)


# ---------------------------------------------------------------------------------------- triton
TRITON_GRID = [
    ("decode_qkv", torch.float32),
    ("decode_qkv", torch.bfloat16),
    ("decode_32_adapters", torch.float16),
    ("prefill_gate_up", torch.float32),
    ("prefill_gate_up", torch.bfloat16),
    ("mixed", torch.float16),
    ("mixed", torch.bfloat16),
]


@pytest.mark.interpret
@pytest.mark.parametrize("case,dtype", TRITON_GRID)
def test_triton_sgmv_matches_oracle(triton_ops, case, dtype):
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build(case, dtype, seed=3)
    num_slices, _, max_rank, _ = a.shape

    poisoned = torch.full((num_slices, len(token_slots), max_rank), float("nan"))
    shrunk = triton_ops.sgmv_shrink(x, a, seg, ranks, out=poisoned)
    assert shrunk is poisoned
    # Every element is written: zeros for slot -1 tokens and beyond each slot's rank.
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "shrink")
    fresh = triton_ops.sgmv_shrink(x, a, seg, ranks)
    assert torch.equal(fresh, shrunk)

    shrunk = garbage_beyond_rank(shrunk, token_slots, ranks)
    y_in = y.clone()
    y_out = triton_ops.sgmv_expand(y_in, shrunk, b, seg, ranks, scales, offsets)
    assert y_out is y_in
    assert_close_scaled(y_out, oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets), dtype, "expand")
    check_untouched_rows(y_out, y, token_slots)
    # And against the reference the engine serves with on CPU.
    y_ref = reference.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)
    assert_close_scaled(y_out, y_ref, dtype, "expand vs reference")


@pytest.mark.interpret
def test_triton_shrink_split_k_matches_single_split(triton_ops, monkeypatch):
    """Decode-shaped shrink splits the hidden dimension; the split count must not change results."""
    from loraplex.kernels import triton_sgmv

    token_slots = [0, 1, -1, 2, 1]
    seg = make_lora_segments(token_slots)
    a, _, ranks, _, _ = make_lora_weights(3, [64, 3, 17], 1000, [8, 8], torch.float32, seed=5)
    x = torch.randn(len(token_slots), 1000)
    monkeypatch.setattr(triton_sgmv, "_target_programs", lambda device: 1)  # no split
    assert triton_sgmv._shrink_config(seg, 2, 64, 1000, x.device)[4] == 1
    one = triton_ops.sgmv_shrink(x, a, seg, ranks)
    monkeypatch.setattr(triton_sgmv, "_target_programs", lambda device: 10_000)  # max split
    assert triton_sgmv._shrink_config(seg, 2, 64, 1000, x.device)[4] == 8  # 1000 / BLOCK_K 128
    many = triton_ops.sgmv_shrink(x, a, seg, ranks)
    assert torch.allclose(one, many, atol=1e-5)
    assert_close_scaled(many, oracle_shrink(x, a, token_slots, ranks), torch.float32, "split shrink")


@pytest.mark.interpret
def test_triton_sgmv_no_lora_and_empty(triton_ops):
    a, b, ranks, scales, offsets = make_lora_weights(2, [4, 8], 16, [8, 8], torch.float32)
    seg = make_lora_segments([-1, -1])
    x, y = torch.randn(2, 16), torch.randn(2, 16)
    out = triton_ops.sgmv_shrink(x, a, seg, ranks, out=torch.full((2, 2, 8), float("nan")))
    assert torch.count_nonzero(out) == 0
    assert torch.equal(triton_ops.sgmv_expand(y.clone(), out, b, seg, ranks, scales, offsets), y)
    empty = make_lora_segments([])
    assert triton_ops.sgmv_shrink(x[:0], a, empty, ranks).shape == (2, 0, 8)


@pytest.mark.interpret
def test_triton_sgmv_strided_views(triton_ops):
    """x a column slice of a wider activation, y a column slice of a fused output (non-contiguous)."""
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build("mixed", torch.float32, seed=7)
    x_wide = torch.randn(x.shape[0], x.shape[1] + 11)
    x_wide[:, 5 : 5 + x.shape[1]] = x
    x_view = x_wide[:, 5 : 5 + x.shape[1]]
    y_wide = torch.randn(y.shape[0], y.shape[1] + 9)
    y_wide[:, 9:] = y
    y_view = y_wide[:, 9:]
    assert not x_view.is_contiguous() and not y_view.is_contiguous()
    shrunk = triton_ops.sgmv_shrink(x_view, a, seg, ranks)
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "strided shrink")
    left = y_wide[:, :9].clone()
    triton_ops.sgmv_expand(y_view, shrunk, b, seg, ranks, scales, offsets)
    assert torch.equal(y_wide[:, :9], left)
    assert_close_scaled(
        y_view, oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets), torch.float32, "strided expand"
    )
