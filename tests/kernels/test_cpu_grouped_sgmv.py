"""The native grouped CPU SGMV (``kernels/csrc/cpu_sgmv.cpp``) against the float64 per-token oracle
and the torch reference: mixed ranks (padding beyond a rank is poison), slot -1, multi-slice outputs,
one slot in several non-contiguous runs, groups longer than a tile, slices wider than a column chunk,
strided views, and results that do not depend on the thread count."""

from __future__ import annotations

import pytest
import torch
from kernel_oracles import (
    assert_close_scaled,
    make_lora_weights,
    oracle_expand,
    oracle_shrink,
    token_slots_from_segments,
)
from test_kernels_sgmv import CASES as SGMV_CASES
from test_kernels_sgmv import _check_untouched_rows, _garbage_beyond_rank

from loraplex.kernels import cpu_native, get_kernel_ops, make_lora_segments, reference

CASES = {
    **SGMV_CASES,
    # One slot in three separate runs with other slots between: grouping must gather them back.
    "scattered_runs": ([(1, 2), (0, 1), (1, 3), (-1, 2), (2, 1), (1, 1), (0, 4)], [7, 16, 3], 50, [30, 10, 10]),
    # 40 tokens of one adapter (more than a shrink tile of 16 and an expand tile of 32), and a
    # slice 600 wide (three column chunks of 256, the last partial), single slice then gate|up.
    "long_group_wide": ([(0, 40), (1, 5)], [16, 4], 64, [600]),
    "long_group_two_slices": ([(1, 33), (-1, 3), (0, 35)], [8, 12], 48, [300, 300]),
}
NATIVE_DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", autouse=True)
def native():
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"


def _build(case, dtype, seed=0):
    segs, ranks, hidden, widths = CASES[case]
    token_slots = token_slots_from_segments(segs)
    a, b, ranks_t, scales, offsets = make_lora_weights(len(ranks), ranks, hidden, widths, dtype, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(len(token_slots), hidden, generator=g).to(dtype)
    y = torch.randn(len(token_slots), offsets[-1], generator=g).to(dtype)
    return token_slots, make_lora_segments(token_slots), x, y, a, b, ranks_t, scales, offsets


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_native_sgmv_matches_oracle(case, dtype):
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build(case, dtype, seed=11)
    shrunk = cpu_native.sgmv_shrink(x, a, seg, ranks)
    assert shrunk.dtype == torch.float32 and shrunk.shape == (a.shape[0], x.shape[0], a.shape[2])
    # Zeros for slot -1 tokens and beyond every slot's rank (the padding there is 1e3: reading it shows).
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "native shrink")

    shrunk = _garbage_beyond_rank(shrunk, token_slots, ranks)
    y_in = y.clone()
    y_out = cpu_native.sgmv_expand(y_in, shrunk, b, seg, ranks, scales, offsets)
    assert y_out is y_in and y_out.dtype == dtype
    expected = oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets)
    assert_close_scaled(y_out, expected, dtype, "native expand")
    _check_untouched_rows(y_out, y, token_slots)
    y_ref = reference.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)
    assert_close_scaled(y_out, y_ref, dtype, "native expand vs reference")


def test_native_sgmv_strided_views():
    """x a column slice of a wider activation, y a column slice of a fused output."""
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build("scattered_runs", torch.float32, seed=4)
    x_wide = torch.randn(x.shape[0], x.shape[1] + 11)
    x_wide[:, 5 : 5 + x.shape[1]] = x
    x_view = x_wide[:, 5 : 5 + x.shape[1]]
    y_wide = torch.randn(y.shape[0], y.shape[1] + 9)
    y_wide[:, 9:] = y
    y_view = y_wide[:, 9:]
    assert not x_view.is_contiguous() and not y_view.is_contiguous()
    shrunk = cpu_native.sgmv_shrink(x_view, a, seg, ranks)
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "strided shrink")
    left = y_wide[:, :9].clone()
    cpu_native.sgmv_expand(y_view, shrunk, b, seg, ranks, scales, offsets)
    assert torch.equal(y_wide[:, :9], left)
    expected = oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets)
    assert_close_scaled(y_view, expected, torch.float32, "strided expand")


def test_native_sgmv_thread_count_independent():
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build("long_group_two_slices", torch.float32, seed=9)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            shrunk = cpu_native.sgmv_shrink(x, a, seg, ranks)
            results.append((shrunk, cpu_native.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)))
    finally:
        torch.set_num_threads(before)
    for shrunk, y_out in results[1:]:
        # Each output element is computed by one thread in a fixed order: bitwise equal.
        assert torch.equal(shrunk, results[0][0])
        assert torch.equal(y_out, results[0][1])


def test_native_sgmv_no_adapter_tokens_and_fp16_fallback():
    seg = make_lora_segments([-1, -1, -1])
    a, b, ranks, scales, offsets = make_lora_weights(2, [4, 8], 16, [8, 8], torch.float32)
    x, y = torch.randn(3, 16), torch.randn(3, 16)
    assert torch.count_nonzero(cpu_native.sgmv_shrink(x, a, seg, ranks)) == 0
    assert torch.equal(cpu_native.sgmv_expand(y.clone(), torch.randn(2, 3, 8), b, seg, ranks, scales, offsets), y)
    # fp16 keeps the torch path (poor CPU support) and still meets the oracle.
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build("mixed", torch.float16, seed=2)
    shrunk = cpu_native.sgmv_shrink(x, a, seg, ranks)
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "fp16 shrink")
    y_out = cpu_native.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)
    expected = oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets)
    assert_close_scaled(y_out, expected, torch.float16, "fp16 expand")


def test_cpu_backend_serves_the_native_sgmv():
    ops = get_kernel_ops("cpu")
    assert ops.sgmv_shrink is cpu_native.sgmv_shrink and ops.sgmv_expand is cpu_native.sgmv_expand
    assert get_kernel_ops("torch").sgmv_shrink is reference.sgmv_shrink  # the oracle backend stays torch
