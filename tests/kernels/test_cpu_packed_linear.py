"""bf16 linear layers on a weight packed at load (``cpu_packed``: oneDNN's blocked copy, or the pair
panels of our vdpbf16ps kernel where the kind picks them) against a float64 oracle and ``F.linear``
on the plain weight, for every CPU kind's path (the kind is a constructor argument, so a machine
without AMX or without native bf16 still runs each path or its reference)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loraplex.kernels import cpu_native, cpu_packed, get_kernel_ops, packed_replaces_weight, pair_panels, reference
from loraplex.kernels.ops import replaced_weight

PACKING_KINDS = ("amx", "avx512_bf16")


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


def _check(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, what: str) -> None:
    """bf16 output: each element is rounded once (relative 2^-9) after float32 accumulation. The
    bound is a few bf16 ulps of the products' magnitude; a wrong row, column or bias is off by
    O(1) x that magnitude."""
    x2, w2 = x.double(), w.double()
    expected = x2 @ w2.T + (0 if bias is None else bias.double())
    scale = (x2.abs() @ w2.abs().T + (0 if bias is None else bias.double().abs())).clamp_min(1.0)
    err = ((y.double() - expected).abs() / scale).max().item() if y.numel() else 0.0
    assert y.dtype == torch.bfloat16 and y.shape == expected.shape, what
    assert err < 2**-7, f"{what}: relative error {err:.3g}"


def _expected_form(bf16: str | None, w: torch.Tensor) -> str:
    """The copy ``CpuLinearOps(kind, bf16)`` makes of a bf16 weight: that choice where it can."""
    if bf16 == "pair_panels" and pair_panels.fits(w) and cpu_packed.pair_panels_available():
        return "pair_panels"
    return "onednn"


def test_kind_from_flags():
    assert cpu_packed.kind_from_flags({"amx_bf16", "amx_tile", "amx_int8", "avx512_bf16"}) == "amx"
    assert cpu_packed.kind_from_flags({"avx512_bf16", "avx512_vnni", "avx512f"}) == "avx512_bf16"
    assert cpu_packed.kind_from_flags({"avx512f", "avx512_vnni"}) == "none"
    assert cpu_packed.kind_from_flags({"amx_tile"}) == "none"  # tiles without bf16 tile ops
    assert cpu_packed.cpu_kind().name in cpu_packed.KINDS
    with pytest.raises(ValueError, match="CPU kind"):
        cpu_packed.CpuLinearOps("sse")


# rows: decode batches (1, 5, 16, 64) and prefill chunks (100, 513); out / in widths off any block.
SHAPES = [(1, 960, 576), (5, 33, 31), (16, 3072, 576), (64, 576, 1536), (100, 17, 96), (513, 130, 64)]


@pytest.mark.parametrize("bf16", cpu_packed.BF16_LINEARS)
@pytest.mark.parametrize("kind", PACKING_KINDS)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_bf16_linear_matches_oracle(kind, m, n, k, with_bias, bf16):
    ops = cpu_packed.CpuLinearOps(kind, bf16)
    w = _bf16(n, k, seed=m + n + k)
    packed = ops.pack_linear_weight(w)
    if packed is None:
        assert not cpu_packed.onednn_bf16()
        pytest.skip(
            "this CPU cannot run oneDNN's bf16 path (it needs avx512bw/vl/dq or avx_ne_convert): nothing is packed"
        )
    assert packed_replaces_weight(packed)
    assert ("onednn" if packed.is_mkldnn else "pair_panels") == _expected_form(bf16, w)
    assert torch.equal(replaced_weight(packed), w), "packing must keep every number"
    bias = _bf16(n, seed=7) if with_bias else None
    x = _bf16(m, k, seed=1)
    y = ops.linear(x, None, bias, packed)  # the plain weight is gone: the model drops it
    _check(y, x, w, bias, f"{kind} m={m} n={n} k={k}")
    twin = F.linear(x, w, bias)  # what the torch backend runs
    assert (y.float() - twin.float()).abs().max().item() <= 2**-7 * twin.float().abs().max().item() + 1e-6
    # The reference reads a replaced weight back from the packed copy.
    assert torch.equal(reference.linear(x, None, bias, packed), twin)


@pytest.mark.parametrize("bf16", cpu_packed.BF16_LINEARS)
@pytest.mark.parametrize("kind", PACKING_KINDS)
def test_packed_bf16_odd_inputs(kind, bf16):
    """A row-strided view, 3-d activations and an empty batch give the oracle's answer; float32
    activations (never sent by a bf16 model) fail as ``F.linear`` on the plain weight does."""
    ops = cpu_packed.CpuLinearOps(kind, bf16)
    w = _bf16(48, 24, seed=3)  # whole panels: the pair-panel kernel takes it where the kind picks it
    packed = ops.pack_linear_weight(w)
    if packed is None:
        assert not cpu_packed.onednn_bf16()
        pytest.skip(
            "this CPU cannot run oneDNN's bf16 path (it needs avx512bw/vl/dq or avx_ne_convert): nothing is packed"
        )
    wide = _bf16(12, 80, seed=4)
    x = wide[:, 30:54]
    assert x.stride(0) == 80
    _check(ops.linear(x, None, None, packed), x, w, None, "strided rows")
    x3 = _bf16(2, 7, 24, seed=5)
    y3 = ops.linear(x3, None, None, packed)
    assert y3.shape == (2, 7, 48)
    _check(y3.reshape(14, 48), x3.reshape(14, 24), w, None, "3-d")
    assert ops.linear(_bf16(0, 24, seed=6), None, None, packed).shape == (0, 48)
    xf = torch.randn(3, 24)
    with pytest.raises(RuntimeError, match="dtype"):
        F.linear(xf, w)
    with pytest.raises(RuntimeError, match="dtype"):
        ops.linear(xf, None, None, packed)


def test_kind_without_native_bf16_keeps_plain_weights():
    """``none``: bf16 is emulated there, so nothing is packed and ``F.linear`` runs on the plain
    weight, bit for bit the torch backend."""
    ops = cpu_packed.CpuLinearOps("none")
    w = _bf16(48, 32, seed=8)
    assert ops.pack_linear_weight(w) is None
    x = _bf16(9, 32, seed=9)
    assert torch.equal(ops.linear(x, w, None, None), F.linear(x, w))


@pytest.mark.parametrize("kind", cpu_packed.KINDS)
def test_float32_weights_keep_the_native_panel_path(kind):
    """A float32 model's weights are not oneDNN-packed on any kind: bf16-exact ones get the native
    kernel's panels (beside the weight), as before this path existed."""
    ops = cpu_packed.CpuLinearOps(kind)
    w = _bf16(40, 24, seed=10).float()
    packed = ops.pack_linear_weight(w)
    assert not packed_replaces_weight(packed)
    if packed is not None:
        assert torch.equal(cpu_native.unpack_linear_weight(packed, 40), w)
    x = torch.randn(5, 24)
    assert torch.allclose(ops.linear(x, w, None, packed), x @ w.T, rtol=1e-5, atol=1e-5)


def test_dispatch_picks_the_cpu_kind_at_load():
    if not cpu_native.available():
        pytest.skip("native kernels not built")
    ops = get_kernel_ops("cpu")
    packed = ops.pack_linear_weight(_bf16(16, 16, seed=11))
    kind = cpu_packed.cpu_kind().name
    assert (packed is not None) == (
        cpu_packed.packs_bf16() or _expected_form(cpu_packed.bf16_linear(kind), _bf16(16, 16, seed=11)) == "pair_panels"
    )
    assert get_kernel_ops("torch").pack_linear_weight(_bf16(16, 16, seed=11)) is None  # the oracle
