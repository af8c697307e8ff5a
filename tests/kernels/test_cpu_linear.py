"""The native decode-sized linear layer (``cpu_native.linear`` over ``pack_linear_weight``'s bf16
panels, ``csrc/cpu_linear.cpp``) against a float64 oracle, and the packing's exactness rules."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels import cpu_native, get_kernel_ops, reference


@pytest.fixture(scope="module", autouse=True)
def native():
    assert cpu_native.available(), "the native CPU kernels did not build (see the RuntimeWarning)"


def _bf16_exact(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g).to(torch.bfloat16).float()


def _oracle(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return y if bias is None else y + bias.double()


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, what: str) -> None:
    """float32 accumulation over k terms: the error bound scales with sqrt(k) x the terms' size.
    A wrong column, row, panel or bias is off by O(1) x that size, far beyond the bound."""
    expected = _oracle(x, w, bias)
    scale = (x.double().abs() @ w.double().abs().T).clamp_min(1.0)
    err = ((y.double() - expected).abs() / scale).max().item()
    assert y.dtype == torch.float32 and y.shape == expected.shape, what
    assert err < 2e-6, f"{what}: relative error {err:.3g}"


# (rows, out features, in features): rows across the 8-row tiles and the last tile's remainders;
# out features not a multiple of a panel (16) or a panel pair (32); odd in features.
SHAPES = [(1, 1, 1), (3, 15, 7), (8, 17, 64), (9, 33, 576), (16, 960, 576), (23, 48, 31), (64, 100, 130)]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_native_linear_matches_float64_oracle(m, n, k, with_bias):
    w = _bf16_exact(n, k, seed=m + n + k)
    packed = cpu_native.pack_linear_weight(w)
    if packed is None:
        pytest.skip("no AVX-512 build here: weights are never packed (the torch path runs)")
    assert packed.dtype == torch.bfloat16 and packed.shape == (-(-n // 16), k, 16)
    assert torch.equal(cpu_native.unpack_linear_weight(packed, n), w)
    bias = torch.randn(n) if with_bias else None
    x = torch.randn(m, k)
    y = cpu_native.linear(x, w, bias, packed)
    _check(y, x, w, bias, f"m={m} n={n} k={k}")
    # Independent of the thread count, bit for bit (items own disjoint output columns).
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_native.linear(x, w, bias, packed), y)
    finally:
        torch.set_num_threads(threads)


def test_native_linear_strided_rows_and_prefill_sizes():
    """A row-strided view (the columns of a wider activation) reads the right elements; batches
    past ``PACKED_MAX_ROWS`` (prefill chunks) go to the float32 GEMM on the original weight and
    still agree with the oracle."""
    w = _bf16_exact(40, 24, seed=3)
    packed = cpu_native.pack_linear_weight(w)
    if packed is None:
        pytest.skip("no AVX-512 build here")
    wide = torch.randn(12, 80)
    x = wide[:, 30:54]
    assert x.stride(0) == 80
    _check(cpu_native.linear(x, w, None, packed), x, w, None, "strided rows")
    big = torch.randn(cpu_native.PACKED_MAX_ROWS + 5, 24)
    _check(cpu_native.linear(big, w, None, packed), big, w, None, "prefill-sized batch")


def test_pack_refuses_what_would_change_the_model():
    """Only a float32 weight that bf16 holds exactly is packed: anything else would serve a
    different model than the checkpoint's."""
    exact = _bf16_exact(20, 8, seed=4)
    if cpu_native.pack_linear_weight(exact) is None:
        pytest.skip("no AVX-512 build here")
    inexact = exact.clone()
    inexact[7, 3] += 2.0**-20  # one element off the bf16 grid
    assert cpu_native.pack_linear_weight(inexact) is None
    assert cpu_native.pack_linear_weight(exact.to(torch.bfloat16)) is None  # a bf16 model reads its own weight
    assert cpu_native.pack_linear_weight(exact.double()) is None
    # Special values survive packing exactly: signed zero, inf, the largest bf16.
    special = torch.tensor([[0.0, -0.0, float("inf"), -3.3895313892515355e38]] * 16)
    packed = cpu_native.pack_linear_weight(special)
    assert packed is not None
    back = cpu_native.unpack_linear_weight(packed, 16)
    assert torch.equal(back, special) and torch.equal(torch.signbit(back), torch.signbit(special))


def test_backends_expose_the_pair():
    """The torch backend (the oracle) keeps no copy and reads the weight; the cpu backend packs."""
    w = _bf16_exact(33, 16, seed=5)
    x = torch.randn(4, 16)
    torch_ops = get_kernel_ops("torch")
    assert torch_ops.pack_linear_weight(w) is None
    assert torch.equal(torch_ops.linear(x, w, None, None), reference.linear(x, w, None, None))
    cpu_ops = get_kernel_ops("cpu")
    packed = cpu_ops.pack_linear_weight(w)
    _check(cpu_ops.linear(x, w, None, packed), x, w, None, "cpu backend")


def test_portable_build_computes_the_same(monkeypatch):
    """A CPU without AVX-512 builds the portable loop: it reports no fast path (so the engine packs
    nothing there) and, called anyway, still computes the oracle's product."""
    w = _bf16_exact(37, 19, seed=6)
    packed = cpu_native.pack_linear_weight(w)
    if packed is None:
        pytest.skip("no AVX-512 build here")
    cxx = cpu_native._compiler()
    assert cxx is not None
    lib = cpu_native.open_library(cpu_native.build(cxx, ("-mno-avx512f", "-mno-f16c")))
    assert lib.lp_linear_fast() == 0
    monkeypatch.setattr(cpu_native, "_lib", lib)
    x = torch.randn(11, 19)
    bias = torch.randn(37)
    _check(cpu_native.linear(x, w, bias, packed), x, w, bias, "portable")
