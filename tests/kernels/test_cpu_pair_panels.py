"""The vdpbf16ps linear kernel on pair panels (``csrc/cpu_linear_bf16.cpp``, ``pair_panels``):
the layout, every row tile and row block, rows independent of the batch and of the thread count,
the portable twin, and what the engine's linear ops pick on each CPU kind (this kernel on
``avx512_bf16``, oneDNN on ``amx``; ``LORAPLEX_BF16_LINEAR`` swaps).

Oracle: the float32 sum of the bf16 products (``x.float() @ w.float().T``) rounded once to bf16.
The kernel adds the same products in another order, so an element may land one bf16 ulp away where
the float32 sums straddle a rounding boundary (plus the float32 sums' own order difference, which
shows where the products cancel); a wrong pairing, panel, row, bias or tail is off by the size of
the products, in most elements."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels import cpu_native, cpu_packed, packed_replaces_weight, pair_panels, reference


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def _oracle(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.float() @ w.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(torch.bfloat16)


def _within_an_ulp(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, what: str) -> None:
    ref = _oracle(x, w, bias)
    assert y.shape == ref.shape and y.dtype == torch.bfloat16, what
    if not ref.numel():
        return
    # One bf16 ulp of the larger neighbour (bf16 keeps 8 significant bits), plus what reordering a
    # float32 sum can move (k terms, 2^-24 each, of the products' magnitude: cancellation).
    size = x.float().abs() @ w.float().abs().T + (0 if bias is None else bias.float().abs())
    ulp = torch.maximum(y.float().abs(), ref.float().abs()) * 2.0**-7 + x.shape[-1] * 2.0**-24 * size
    off = (y.float() - ref.float()).abs()
    assert bool((off <= ulp).all()), f"{what}: {int((off > ulp).sum())} elements more than an ulp off"
    assert (off == 0).float().mean().item() > 0.95, f"{what}: too few elements exact"


def _need_panels() -> None:
    if not cpu_native.available():
        pytest.skip("native kernels not built")


def test_layout_round_trip_and_shape_rules():
    w = _bf16(48, 10, seed=1)
    p = pair_panels.pack(w)
    assert p.shape == (3, 5, 16, 2) and pair_panels.is_packed(p)
    assert torch.equal(pair_panels.unpack(p), w)
    # element [p][kk][j][t] = W[16p + j][2kk + t]
    assert p[2, 3, 5, 1] == w[16 * 2 + 5, 2 * 3 + 1] and p[0, 4, 15, 0] == w[15, 8]
    assert not pair_panels.fits(_bf16(40, 10, seed=2))  # not whole panels: oneDNN keeps it
    assert not pair_panels.fits(_bf16(48, 9, seed=3))  # odd inputs
    assert not pair_panels.fits(_bf16(0, 10, seed=3))
    assert not pair_panels.is_packed(None)
    assert not pair_panels.is_packed(torch.zeros(3, 5, 16))  # the float32 path's panels are 3-D
    assert not pair_panels.is_packed(torch.zeros(3, 5, 16, 2))  # float32: not a copy of a bf16 weight
    assert packed_replaces_weight(p)
    # The reference reads a replaced weight back from the panels.
    x = _bf16(3, 10, seed=4)
    assert torch.equal(reference.linear(x, None, None, p), torch.nn.functional.linear(x, w))


# rows across the 8-row tile, the 4-row tile, single rows and the 128-row block; groups of 3, 2 and
# 1 panels (the last group of a width holds what is left); the demo model's widths and small ones.
@pytest.mark.parametrize("m", [1, 3, 4, 5, 7, 8, 9, 13, 16, 28, 64, 127, 128, 129, 300])
@pytest.mark.parametrize("n,k", [(48, 64), (16, 8), (64, 576), (960, 576), (32, 1536)])
def test_kernel_matches_the_float32_oracle(m, n, k):
    _need_panels()
    w, x, b = _bf16(n, k, seed=m + n), _bf16(m, k, seed=k + m), _bf16(n, seed=n)
    p = pair_panels.pack(w)
    _within_an_ulp(cpu_packed.linear_pair_panels(x, p, b), x, w, b, f"m={m} n={n} k={k} bias")
    _within_an_ulp(cpu_packed.linear_pair_panels(x, p, None), x, w, None, f"m={m} n={n} k={k}")


def test_rows_do_not_depend_on_the_batch_or_the_threads():
    """Each row's result is the same bits alone, at any position in any batch size, with 1 or 2
    threads: the kernel splits work by output columns and runs one instruction sequence per row."""
    _need_panels()
    w, b = _bf16(96, 576, seed=5), _bf16(96, seed=6)
    p = pair_panels.pack(w)
    x = _bf16(205, 576, seed=7)
    full = cpu_packed.linear_pair_panels(x, p, b)
    for r in (0, 7, 8, 11, 12, 100, 127, 128, 191, 192, 204):
        assert torch.equal(cpu_packed.linear_pair_panels(x[r : r + 1], p, b)[0], full[r]), r
    for lo, hi in ((3, 20), (120, 135), (190, 205), (0, 13)):
        assert torch.equal(cpu_packed.linear_pair_panels(x[lo:hi], p, b), full[lo:hi])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_packed.linear_pair_panels(x, p, b), full)
    finally:
        torch.set_num_threads(threads)


def test_strided_rows_3d_input_and_empty_batch():
    _need_panels()
    w = _bf16(64, 24, seed=8)
    p = pair_panels.pack(w)
    wide = _bf16(13, 80, seed=9)
    x = wide[:, 30:54]
    assert x.stride(0) == 80
    _within_an_ulp(cpu_packed.linear_pair_panels(x, p, None), x, w, None, "strided rows")
    x3 = _bf16(2, 7, 24, seed=10)
    y3 = cpu_packed.linear_pair_panels(x3, p, None)
    assert y3.shape == (2, 7, 64)
    _within_an_ulp(y3.reshape(14, 64), x3.reshape(14, 24), w, None, "3-d")
    assert cpu_packed.linear_pair_panels(_bf16(0, 24, seed=11), p, None).shape == (0, 64)
    with pytest.raises(AssertionError, match="features"):
        cpu_packed.linear_pair_panels(_bf16(2, 22, seed=12), p, None)


def test_portable_twin_computes_the_same(monkeypatch):
    """A build without AVX512-BF16 runs the scalar twin on the same layout: the oracle's numbers
    (so the layout and the bookkeeping are tested on any CPU); it reports that it is not the
    fast kernel, and the linear ops then do not pack pair panels."""
    cxx = cpu_native._compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    lib = cpu_native.open_library(cpu_native.build(cxx, ("-mno-avx512bf16",)))
    assert lib.lp_linear_bf16_dp_isa() == 0
    monkeypatch.setattr(cpu_native, "_lib", lib)
    monkeypatch.setattr(cpu_native, "_tried", True)
    for m, n, k in ((1, 48, 64), (13, 96, 40), (200, 32, 576)):
        w, x, b = _bf16(n, k, seed=m), _bf16(m, k, seed=n), _bf16(n, seed=k)
        _within_an_ulp(cpu_packed.linear_pair_panels(x, pair_panels.pack(w), b), x, w, b, f"portable m={m}")
    assert not cpu_packed.pair_panels_available()
    assert cpu_packed.pack_pair_panels(_bf16(48, 64, seed=1)) is None
    copy = cpu_packed.CpuLinearOps("avx512_bf16", "pair_panels").pack_linear_weight(_bf16(48, 64, seed=1))
    assert copy is None or copy.is_mkldnn  # oneDNN's copy (where it runs) instead


def test_each_kind_picks_its_bf16_linear(monkeypatch):
    """``avx512_bf16`` packs pair panels (where the kernel is built), ``amx`` keeps oneDNN's copy
    (its AMX tiles), ``none`` packs nothing; ``LORAPLEX_BF16_LINEAR`` swaps the choice on either
    kind and refuses an unknown name; a weight without whole panels stays on oneDNN; float32
    activations (never sent by a bf16 model) fail as ``F.linear`` does."""
    _need_panels()
    monkeypatch.delenv("LORAPLEX_BF16_LINEAR", raising=False)
    w = _bf16(48, 64, seed=13)
    assert cpu_packed.bf16_linear("avx512_bf16") == "pair_panels"
    assert cpu_packed.bf16_linear("amx") == "onednn"
    assert cpu_packed.bf16_linear("none") is None
    ops = cpu_packed.CpuLinearOps("avx512_bf16")
    panels = ops.pack_linear_weight(w)
    if cpu_packed.pair_panels_available():
        assert pair_panels.is_packed(panels)
        x = _bf16(5, 64, seed=14)
        assert torch.equal(ops.linear(x, None, None, panels), cpu_packed.linear_pair_panels(x, panels, None))
        with pytest.raises(RuntimeError, match="dtype"):
            ops.linear(torch.randn(3, 64), None, None, panels)
    odd = ops.pack_linear_weight(_bf16(40, 64, seed=15))
    assert odd is None or odd.is_mkldnn
    amx = cpu_packed.CpuLinearOps("amx").pack_linear_weight(w)
    assert amx is None or amx.is_mkldnn
    assert cpu_packed.CpuLinearOps("none").pack_linear_weight(w) is None
    monkeypatch.setenv("LORAPLEX_BF16_LINEAR", "onednn")
    copy = cpu_packed.CpuLinearOps("avx512_bf16").pack_linear_weight(w)
    assert copy is None or copy.is_mkldnn
    monkeypatch.setenv("LORAPLEX_BF16_LINEAR", "pair_panels")
    assert cpu_packed.CpuLinearOps("amx").bf16 == "pair_panels"
    monkeypatch.setenv("LORAPLEX_BF16_LINEAR", "mkl")
    with pytest.raises(ValueError, match="LORAPLEX_BF16_LINEAR"):
        cpu_packed.CpuLinearOps("avx512_bf16")
