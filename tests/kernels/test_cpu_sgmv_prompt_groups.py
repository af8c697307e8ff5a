"""Prompt-sized SGMV groups on the vdpbf16ps tiles (``csrc/cpu_sgmv.cpp``, bf16 activations and
adapter weights, groups of >= ``PROMPT_GROUP_MIN_TOKENS`` consecutive tokens of one adapter) against
the float64 per-token oracle: group sizes around the threshold and the 32-token tiles, ranks of one
to four 16-lane panels (odd ones, poison beyond the rank), slice widths that are and are not
multiples of 16 (the latter keep the per-token expand), a slot whose tokens are not consecutive,
decode rows beside prompt groups; that the tiles really run (their bits differ from the per-token
loops'), that the batch-invariant ops switch them off, and the portable build."""

from __future__ import annotations

import pytest
import torch
from kernel_oracles import (
    assert_close_scaled,
    check_untouched_rows,
    garbage_beyond_rank,
    make_lora_weights,
    oracle_expand,
    oracle_shrink,
    token_slots_from_segments,
)

from loraplex.kernels import batch_invariant_ops, cpu_native, cpu_sgmv, get_kernel_ops, make_lora_segments

M = cpu_sgmv.PROMPT_GROUP_MIN_TOKENS
# (segments [(slot, tokens)], ranks per slot, hidden, slice widths)
CASES = {
    # SmolLM2's qkv shapes: two prompts of 128 and 129 tokens beside 3 decode rows of other slots.
    "prompts_beside_decodes": ([(0, 128), (2, 1), (1, 129), (3, 1), (2, 1)], [16, 16, 8, 16], 576, [576, 192, 192]),
    # Around the threshold and the tiles: M - 1 (per-token loops), M, 33 (a tile and one token).
    "threshold": ([(0, M - 1), (1, M), (2, 33)], [16, 5, 9], 64, [64, 32]),
    # Ranks over several panels (17, 32, 64) and an odd one; down_proj-like hidden.
    "wide_ranks": ([(0, 40), (1, 20), (2, 24)], [17, 64, 33], 160, [96]),
    # Widths not a multiple of 16 (expand stays per-token there; shrink still tiles).
    "odd_widths": ([(0, 50), (1, 18)], [16, 7], 96, [600, 40]),
    # One slot's tokens interleaved with another's: not consecutive, so the per-token loops.
    "interleaved": ([(0, 1), (1, 1)] * 20, [16, 16], 64, [64]),
}


@pytest.fixture(scope="module", autouse=True)
def native():
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"


def _build(case, seed):
    segs, ranks, hidden, widths = CASES[case]
    token_slots = token_slots_from_segments(segs)
    a, b, ranks_t, scales, offsets = make_lora_weights(len(ranks), ranks, hidden, widths, torch.bfloat16, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(len(token_slots), hidden, generator=g).to(torch.bfloat16)
    y = torch.randn(len(token_slots), offsets[-1], generator=g).to(torch.bfloat16)
    return token_slots, make_lora_segments(token_slots), x, y, a, b, ranks_t, scales, offsets


@pytest.mark.parametrize("case", list(CASES))
def test_prompt_groups_match_the_oracle(case):
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build(case, seed=len(case))
    shrunk = cpu_sgmv.sgmv_shrink(x, a, seg, ranks)
    assert_close_scaled(shrunk, oracle_shrink(x, a, token_slots, ranks), torch.float32, f"{case} shrink")
    # Within fp32 summation order of the per-token loops' result.
    per_token = cpu_sgmv.sgmv_shrink(x, a, seg, ranks, prompt_groups=False)
    assert_close_scaled(shrunk, per_token, torch.float32, f"{case} shrink vs per-token")
    shrunk = garbage_beyond_rank(shrunk, token_slots, ranks)
    y_out = cpu_sgmv.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)
    expected = oracle_expand(y, shrunk, b, token_slots, ranks, scales, offsets)
    assert_close_scaled(y_out, expected, torch.bfloat16, f"{case} expand")
    # The LoRA delta itself within bf16 rounding of its own size (a wrong or missing update of a
    # small delta would hide inside y's magnitude above).
    delta, want = (y_out.double() - y.double()), (expected - y.double())
    assert_close_scaled(delta, want, torch.bfloat16, f"{case} expand delta")
    check_untouched_rows(y_out, y, token_slots)


def test_the_tiles_run_and_batch_invariant_ops_switch_them_off():
    """On a CPU with AVX512-BF16 a 128-token group's outputs are not bit for bit the per-token
    loops' (the shrunk activations rounded to bf16): the tiles ran. The batch-invariant ops pass
    ``prompt_groups=False``."""
    inv = batch_invariant_ops(get_kernel_ops("cpu"))
    assert inv.sgmv_shrink.keywords == {"prompt_groups": False}  # type: ignore[attr-defined]
    assert inv.sgmv_expand.keywords == {"prompt_groups": False}  # type: ignore[attr-defined]
    if not cpu_sgmv.prompt_groups_available():
        pytest.skip("this CPU has no AVX512-BF16: prompt groups take the per-token loops")
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build("prompts_beside_decodes", seed=3)
    shrunk = cpu_sgmv.sgmv_shrink(x, a, seg, ranks)
    tiles = cpu_sgmv.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets)
    loops = cpu_sgmv.sgmv_expand(y.clone(), shrunk, b, seg, ranks, scales, offsets, prompt_groups=False)
    prompt_rows = torch.tensor([s in (0, 1) for s in token_slots])
    assert not torch.equal(tiles[prompt_rows], loops[prompt_rows])
    assert torch.equal(tiles[~prompt_rows], loops[~prompt_rows])  # decode rows: the same loops


def test_portable_build_takes_the_per_token_loops(monkeypatch):
    """A build without AVX512-BF16 reports no prompt-group tiles; the ``_groups`` entry points then
    run the per-token loops (same numbers as the oracle)."""
    cxx = cpu_native._compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    lib = cpu_native.open_library(cpu_native.build(cxx, ("-mno-avx512bf16",)))
    assert lib.lp_sgmv_prompt_groups() == 0
    monkeypatch.setattr(cpu_native, "_lib", lib)
    monkeypatch.setattr(cpu_native, "_tried", True)
    assert not cpu_sgmv.prompt_groups_available()
    token_slots, seg, x, y, a, b, ranks, scales, offsets = _build("threshold", seed=9)
    out = torch.zeros(a.shape[0], x.shape[0], a.shape[2])
    g = cpu_sgmv._groups(seg)
    num_slices, num_slots, max_rank, hidden = a.shape
    lib.lp_sgmv_shrink_bf16_bf16_groups(
        x.data_ptr(), x.stride(0), a.data_ptr(), out.data_ptr(), x.shape[0], hidden, num_slices, num_slots, max_rank,
        ranks.data_ptr(), g.group_slot.data_ptr(), g.group_start.data_ptr(), g.num_groups, g.token_idx.data_ptr(),
        2, M,
    )  # fmt: skip
    assert_close_scaled(out, oracle_shrink(x, a, token_slots, ranks), torch.float32, "portable groups shrink")
