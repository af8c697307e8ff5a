"""The native grouped CPU SGMV (``kernels/csrc/cpu_sgmv.cpp``) against the float64 per-token oracle
and the torch reference: mixed ranks (padding beyond a rank is poison), slot -1, multi-slice outputs,
one slot in several non-contiguous runs, groups longer than a tile, slices wider than a column chunk,
strided views, and results that do not depend on the thread count."""

from __future__ import annotations

import pytest
import torch
from kernel_oracles import (
    SGMV_CASES,
    assert_close_scaled,
    check_untouched_rows,
    garbage_beyond_rank,
    make_lora_weights,
    oracle_expand,
    oracle_shrink,
    token_slots_from_segments,
)

from loraplex.kernels import cpu_native, cpu_sgmv, get_kernel_ops, make_lora_segments, reference

CASES = {
    **SGMV_CASES,
    # One slot in three separate runs with other slots between: grouping must gather them back.
    "scattered_runs": ([(1, 2), (0, 1), (1, 3), (-1, 2), (2, 1), (1, 1), (0, 4)], [7, 16, 3], 50, [30, 10, 10]),
    # 40 tokens of one adapter (more than a shrink tile of 16 and an expand tile of 32), and a
    # slice 600 wide (three column chunks of 256, the last partial), single slice then gate|up.
    "long_group_wide": ([(0, 40), (1, 5)], [16, 4], 64, [600]),
    "long_group_two_slices": ([(1, 33), (-1, 3), (0, 35)], [8, 12], 48, [300, 300]),
    # Decode over several adapters (groups of 1-4 tokens: each item sweeps up to 4 column chunks
    # of the slot's whole width), odd ranks, slices with partial 16-column tails: six chunks
    # (1024 + 76, 300, 1024 + 1024 + 52), so two sweep items per group.
    "decode_wide_sweep": ([(2, 1), (0, 3), (-1, 1), (1, 4), (3, 1), (0, 1)], [7, 16, 1, 5], 80, [1100, 300, 2100]),
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
    shrunk = cpu_sgmv.sgmv_shrink(x, a, seg, ranks)
    assert shrunk.dtype == torch.float32 and shrunk.shape == (a.shape[0], x.shape[0], a.shape[2])
    # Zeros for slot -1 tokens and beyond every slot's rank (the padding there is 1e3: reading it shows).
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "native shrink")

    shrunk = garbage_beyond_rank(shrunk, token_slots, ranks)
    y_in = y.clone()
    y_out = cpu_sgmv.sgmv_expand(y_in, shrunk, b, seg, ranks, scales, offsets)
    assert y_out is y_in and y_out.dtype == dtype
    expected = oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets)
    assert_close_scaled(y_out, expected, dtype, "native expand")
    check_untouched_rows(y_out, y, token_slots)
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
    shrunk = cpu_sgmv.sgmv_shrink(x_view, a, seg, ranks)
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "strided shrink")
    left = y_wide[:, :9].clone()
    cpu_sgmv.sgmv_expand(y_view, shrunk, b, seg, ranks, scales, offsets)
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
            shrunk = cpu_sgmv.sgmv_shrink(x, a, seg, ranks)
            results.append((shrunk, cpu_sgmv.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)))
    finally:
        torch.set_num_threads(before)
    for shrunk, y_out in results[1:]:
        # Each output element is computed by one thread in a fixed order: bitwise equal.
        assert torch.equal(shrunk, results[0][0])
        assert torch.equal(y_out, results[0][1])


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16, torch.float16])
def test_native_sgmv_row_independent_of_its_group(wdtype):
    """Batch invariance: a token's shrunk row and output row are bitwise the same whether its adapter
    group holds 1 token (decode: the column-sweep items), 4, 5 or 40 (prefill: tiles, one chunk
    per item), wherever in the group it sits, with prompt-sized groups kept on the per-token loops
    (``prompt_groups=False``, what the batch-invariant ops pass; the vdpbf16ps prompt-group tiles
    round the shrunk activations: tests/kernels/test_cpu_sgmv_prompt_groups.py)."""
    hidden, widths, rank = 72, [1100, 40], 9
    a, b, ranks, scales, offsets = make_lora_weights(2, [rank, 3], hidden, widths, torch.float32, 3)
    a, b = a.to(wdtype), b.to(wdtype)
    g = torch.Generator().manual_seed(8)
    x_row = torch.randn(hidden, generator=g).to(torch.bfloat16)
    y_row = torch.randn(offsets[-1], generator=g).to(torch.bfloat16)
    results = []
    for n, at in ((1, 0), (4, 3), (5, 2), (40, 17), (40, 39)):
        x = torch.randn(n + 1, hidden, generator=g).to(torch.bfloat16)
        y = torch.randn(n + 1, offsets[-1], generator=g).to(torch.bfloat16)
        x[at], y[at] = x_row, y_row
        seg = make_lora_segments([0] * n + [1])
        shrunk = cpu_sgmv.sgmv_shrink(x, a, seg, ranks, prompt_groups=False)
        y_out = cpu_sgmv.sgmv_expand(y, shrunk, b, seg, ranks, scales, offsets, prompt_groups=False)
        results.append((shrunk[:, at].clone(), y_out[at].clone()))
    for shrunk_row, y_out_row in results[1:]:
        assert torch.equal(shrunk_row, results[0][0])
        assert torch.equal(y_out_row, results[0][1])


def test_native_sgmv_no_adapter_tokens_and_fp16_fallback():
    seg = make_lora_segments([-1, -1, -1])
    a, b, ranks, scales, offsets = make_lora_weights(2, [4, 8], 16, [8, 8], torch.float32)
    x, y = torch.randn(3, 16), torch.randn(3, 16)
    assert torch.count_nonzero(cpu_sgmv.sgmv_shrink(x, a, seg, ranks)) == 0
    assert torch.equal(cpu_sgmv.sgmv_expand(y.clone(), torch.randn(2, 3, 8), b, seg, ranks, scales, offsets), y)
    # fp16 keeps the torch path (poor CPU support) and still meets the oracle.
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build("mixed", torch.float16, seed=2)
    shrunk = cpu_sgmv.sgmv_shrink(x, a, seg, ranks)
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, "fp16 shrink")
    y_out = cpu_sgmv.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)
    expected = oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets)
    assert_close_scaled(y_out, expected, torch.float16, "fp16 expand")


def test_cpu_backend_serves_the_native_sgmv():
    ops = get_kernel_ops("cpu")
    assert ops.sgmv_shrink is cpu_sgmv.sgmv_shrink and ops.sgmv_expand is cpu_sgmv.sgmv_expand
    assert get_kernel_ops("torch").sgmv_shrink is reference.sgmv_shrink  # the oracle backend stays torch


def _check_against_oracle(act_dtype, case, seed, what):
    """Activations in ``act_dtype``, adapter weights stored in float16 (``lora_dtype="float16"``):
    the kernel must compute with exactly the stored (rounded) weights, in fp32."""
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build(case, torch.float32, seed=seed)
    x, y = x.to(act_dtype), y.to(act_dtype)
    a16, b16 = a.to(torch.float16), b.to(torch.float16)
    shrunk = cpu_sgmv.sgmv_shrink(x, a16, seg, ranks)
    assert_close_scaled(shrunk, oracle_shrink(x, a16, token_slots, ranks), torch.float32, f"{what} shrink")
    y_out = cpu_sgmv.sgmv_expand(y.clone(), shrunk, b16, seg, ranks, scales, offsets)
    assert y_out.dtype == act_dtype
    expected = oracle_expand(y, shrunk, b16, token_slots, ranks, scales, offsets)
    assert_close_scaled(y_out, expected, act_dtype, f"{what} expand")
    check_untouched_rows(y_out, y, token_slots)
    y_ref = reference.sgmv_expand(y.clone(), shrunk, b16, seg, ranks, scales, offsets)  # the torch twin
    assert_close_scaled(y_out, y_ref, act_dtype, f"{what} expand vs reference")


@pytest.mark.parametrize("act_dtype", NATIVE_DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_native_sgmv_float16_weights_match_oracle(case, act_dtype):
    _check_against_oracle(act_dtype, case, 21, "fp16 weights")


def test_native_sgmv_float16_weights_are_not_the_fp32_result_truncated():
    """A kernel that read the float16 bits as bf16 (or as fp32) would be far off: the fp16 result
    is within fp16 rounding of the fp32 one, and not equal to a bf16-rounded computation."""
    token_slots, seg, x, _, a, _, ranks, _, _ = _build("mixed", torch.float32, seed=3)
    out16 = cpu_sgmv.sgmv_shrink(x, a.to(torch.float16), seg, ranks)
    out32 = cpu_sgmv.sgmv_shrink(x, a, seg, ranks)
    outbf = cpu_sgmv.sgmv_shrink(x, a.to(torch.bfloat16).float(), seg, ranks)
    err16, errbf = (out16 - out32).abs().max(), (outbf - out32).abs().max()
    assert 0 < err16 < errbf / 4  # fp16 has 3 more mantissa bits than bf16


@pytest.mark.slow  # a compiler subprocess (seconds; minutes on a crowded machine)
@pytest.mark.timeout(1800)
def test_portable_build_without_avx512_or_f16c(monkeypatch):
    """A CPU without AVX-512 / F16C gets the portable loops (float16 converted by bit arithmetic):
    built here with those ISA extensions switched off, it reports no fast float16 (so
    ``lora_dtype="auto"`` keeps the model dtype there) and still computes every dtype pairing right."""
    cxx = cpu_native._compiler()
    assert cxx is not None
    lib = cpu_native.open_library(cpu_native.build(cxx, ("-mno-avx512f", "-mno-f16c")))
    assert lib.lp_sgmv_fast_f16() == 0
    assert cpu_native.load() is not None and cpu_native.load().lp_sgmv_fast_f16() in (0, 1)
    monkeypatch.setattr(cpu_native, "_lib", lib)
    for act in NATIVE_DTYPES:
        _check_against_oracle(act, "scattered_runs", 5, f"portable {act}")
        _check_against_oracle(act, "long_group_two_slices", 6, f"portable {act}")
        _check_against_oracle(act, "decode_wide_sweep", 7, f"portable {act}")
    # Special float16 values through the bit-arithmetic conversion: subnormals, inf, signed zero.
    special = torch.tensor([6e-8, -3e-5, 65504.0, -0.0, 1.0, -2.5], dtype=torch.float16)
    a = torch.zeros(1, 1, 1, 16, dtype=torch.float16)
    seg = make_lora_segments([0] * 6)
    x = torch.zeros(6, 16)
    for i in range(6):
        x[i, i] = 1.0
    a[0, 0, 0, :6] = special
    out = cpu_sgmv.sgmv_shrink(x, a, seg, torch.tensor([1], dtype=torch.int32))
    assert torch.equal(out[0, :, 0], special.float())
