"""The native bf16 element-wise glue (``cpu_elementwise.rms_norm`` / ``silu_mul``, ``csrc/cpu_elementwise.cpp``)
against its torch twins (``reference.rms_norm`` / ``silu_mul``, the oracle).

Both round to bf16 after each op like torch; only the fp32 sum of squares' order and the exp's last
bits differ, so a result may be one bf16 ulp off where the fp32 value sits on a rounding boundary:
the tests allow that on a tiny share of the elements and nothing else."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels import cpu_elementwise, cpu_native, get_kernel_ops, reference


@pytest.fixture(scope="module", autouse=True)
def native():
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"


def _same_up_to_an_ulp(got: torch.Tensor, want: torch.Tensor, what: str, share: float = 1e-3) -> None:
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape, what
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), f"{what}: NaNs differ"
    g, w = got[~nan].float(), want[~nan].float()
    exact = (g == w) | (torch.isinf(w) & (g == w))
    off = ~exact
    # One bf16 ulp of the larger magnitude: 2^-7 relative (bf16 keeps 8 significant bits).
    ulp = torch.maximum(g.abs(), w.abs()) * 2.0**-7
    assert bool(((g - w).abs()[off] <= ulp[off] * 1.001).all()), f"{what}: a difference beyond one bf16 ulp"
    assert off.sum().item() <= max(1, share * w.numel()), f"{what}: {off.sum().item()} of {w.numel()} differ"


def _rows(rows: int, h: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, h, generator=g) * scale).to(torch.bfloat16)


@pytest.mark.parametrize("h", [1, 15, 16, 17, 64, 576, 1000])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_rms_norm_matches_torch(rows, h):
    for seed, scale in ((0, 1.0), (1, 300.0), (2, 1e-3)):
        x, w = _rows(rows, h, seed, scale), _rows(1, h, seed + 10)[0]
        _same_up_to_an_ulp(cpu_elementwise.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5), f"{rows}x{h} x{scale}")


def test_rms_norm_strided_rows_specials_and_threads():
    big = _rows(33, 700, 3)
    x = big[:, 50:626]  # a row stride of 700, not 576
    w = _rows(1, 576, 4)[0]
    x[0] = 0.0  # rsqrt(eps) times 0
    x[1, 5] = float("inf")
    x[2, 7] = float("nan")
    x[3] = 1e30  # the squares overflow fp32: rsqrt(inf) = 0
    want = reference.rms_norm(x, w, 1e-6)
    _same_up_to_an_ulp(cpu_elementwise.rms_norm(x, w, 1e-6), want, "strided + specials")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_elementwise.rms_norm(x, w, 1e-6)
        torch.set_num_threads(2)
        two = cpu_elementwise.rms_norm(x, w, 1e-6)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one.view(torch.int16), two.view(torch.int16)), "result depends on the thread count"


@pytest.mark.parametrize("n", [1, 7, 16, 17, 100, 1536])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_silu_mul_matches_torch(rows, n):
    for seed, scale in ((0, 1.0), (1, 30.0), (2, 1e-2)):
        gu = _rows(rows, 2 * n, seed, scale)
        _same_up_to_an_ulp(cpu_elementwise.silu_mul(gu), reference.silu_mul(gu), f"{rows}x{n} x{scale}")


def test_silu_mul_extremes_and_strided_rows():
    gate = torch.tensor([0.0, -0.0, 1e-30, -80.0, -88.5, -89.0, -95.0, -104.0, -200.0, 88.0, 200.0,
                         float("inf"), float("-inf"), float("nan"), 3.0, -3.0])  # fmt: skip
    up = torch.tensor([1.0, 2.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 1.0, 1.0, 1.0, float("inf"), 0.0])
    gu = torch.cat([gate, up]).to(torch.bfloat16).unsqueeze(0).repeat(3, 1)
    _same_up_to_an_ulp(cpu_elementwise.silu_mul(gu), reference.silu_mul(gu), "extremes", share=0.0)
    wide = _rows(9, 2 * 40 + 6, 5)[:, : 2 * 40]  # row stride 86 for a 2 x 40 gate|up
    _same_up_to_an_ulp(cpu_elementwise.silu_mul(wide), reference.silu_mul(wide), "strided")


def test_float32_and_odd_inputs_take_the_torch_twin_exactly():
    x = torch.randn(5, 33)
    w = torch.randn(33)
    assert torch.equal(cpu_elementwise.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5))
    gu = torch.randn(5, 66)
    assert torch.equal(cpu_elementwise.silu_mul(gu), reference.silu_mul(gu))
    x3 = _rows(6, 16, 7).view(2, 3, 16)  # 3-d: the twin
    assert torch.equal(
        cpu_elementwise.rms_norm(x3, _rows(1, 16, 8)[0], 1e-5), reference.rms_norm(x3, _rows(1, 16, 8)[0], 1e-5)
    )
    empty = torch.empty(0, 16, dtype=torch.bfloat16)
    assert cpu_elementwise.rms_norm(empty, _rows(1, 16, 8)[0], 1e-5).shape == (0, 16)
    assert cpu_elementwise.silu_mul(torch.empty(0, 16, dtype=torch.bfloat16)).shape == (0, 8)


def test_backends_expose_the_ops():
    assert get_kernel_ops("torch").rms_norm is reference.rms_norm
    assert get_kernel_ops("cpu").rms_norm is cpu_elementwise.rms_norm
    assert get_kernel_ops("cpu").silu_mul is cpu_elementwise.silu_mul


def test_portable_build_computes_the_same(monkeypatch):
    """A CPU without AVX-512 builds the scalar loops: the same numbers."""
    cxx = cpu_native._compiler()
    assert cxx is not None
    lib = cpu_native.open_library(cpu_native.build(cxx, ("-mno-avx512f", "-mno-f16c")))
    monkeypatch.setattr(cpu_native, "_lib", lib)
    x, w = _rows(9, 37, 9, 5.0), _rows(1, 37, 10)[0]
    _same_up_to_an_ulp(cpu_elementwise.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5), "portable rms")
    gu = _rows(9, 2 * 37, 11, 8.0)
    _same_up_to_an_ulp(cpu_elementwise.silu_mul(gu), reference.silu_mul(gu), "portable silu")


def test_mixed_dtypes_and_mismatched_weight_fall_back_to_the_twin():
    x = _rows(4, 32, 12)
    w32 = torch.randn(32)  # a float32 weight beside bf16 rows (a model cast halfway): torch's promotion
    assert torch.equal(cpu_elementwise.rms_norm(x, w32, 1e-5), reference.rms_norm(x, w32, 1e-5))
    with pytest.raises(RuntimeError):  # a weight of the wrong width fails as torch fails, not out of bounds
        cpu_elementwise.rms_norm(x, _rows(1, 31, 13)[0], 1e-5)
    with pytest.raises(RuntimeError):  # an odd gate|up width: the twin's halves do not match, as in torch
        cpu_elementwise.silu_mul(_rows(3, 9, 14))
