"""INT8 weight-only matmul: quantization round trip, the CPU serving path and the Triton kernel
(interpreter on CPU) against a float64 oracle built from the dequantized weights."""

from __future__ import annotations

import pytest
import torch

from loraplex.kernels import TORCH_OPS, dequantize_int8, int8_linear_reference, quantize_per_channel_int8

# (M rows, K in, N out): a decode row, a batch-of-decodes, rows past the int8pack threshold,
# K not a multiple of 16 (the int8pack op cannot take it), dimensions that are not multiples of any tile.
SHAPES = [(1, 64, 96), (7, 48, 33), (5, 40, 24), (32, 72, 48), (37, 100, 130)]


def _case(m, k, n, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.2
    w[3] = 0.0  # an all-zero output channel must not divide by zero
    x = torch.randn(m, k, generator=g).to(dtype)
    b = (torch.randn(n, generator=g) * 0.1).to(dtype) if bias else None
    q, s = quantize_per_channel_int8(w)
    return w, x, b, q, s


def _oracle(x, q, s, b):
    y = x.double() @ (q.double() * s.double()[:, None]).T
    return y + b.double() if b is not None else y


def test_quantization_is_symmetric_per_channel_and_bounded():
    w = torch.randn(50, 30) * torch.linspace(0.01, 3.0, 50)[:, None]  # very different row ranges
    q, s = quantize_per_channel_int8(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (50,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    # Round to nearest: every weight is within half a step of its channel's grid.
    err = (dequantize_int8(q, s, torch.float32) - w).abs()
    assert bool((err <= s[:, None] / 2 + 1e-7).all())
    assert torch.equal(quantize_per_channel_int8(-w)[0], -q)  # symmetric


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_reference_and_cpu_path_match_oracle(m, k, n, dtype):
    w, x, b, q, s = _case(m, k, n, dtype, bias=(m % 2 == 1))
    exp = _oracle(x, q, s, b)
    ref = int8_linear_reference(x, q, s, b)
    cpu = TORCH_OPS.int8_linear(x, q, s, b)
    assert ref.dtype == dtype and cpu.dtype == dtype and cpu.shape == (m, n)
    # Tolerance relative to the output scale: fp32 accumulates exactly enough for 1e-5; the CPU
    # path runs decode-sized inputs through bf16 activations (2^-8 relative) and bf16 outputs.
    scale = exp.abs().max().item()
    tol_ref = 1e-5 if dtype == torch.float32 else 1e-2
    assert (ref.double() - exp).abs().max().item() <= tol_ref * scale
    assert (cpu.double() - exp).abs().max().item() <= 1.5e-2 * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_triton_int8_gemm_matches_oracle(triton_ops, m, k, n, dtype):
    w, x, b, q, s = _case(m, k, n, dtype, bias=(m % 2 == 0), seed=1)
    out = triton_ops.int8_linear(x, q, s, b)
    exp = _oracle(x, q, s, b)
    assert out.dtype == dtype and out.shape == (m, n)
    # fp32 accumulation of exact products: only the output rounding of the dtype remains.
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    assert (out.double() - exp).abs().max().item() <= tol * exp.abs().max().item()


def test_triton_int8_gemm_handles_3d_input_and_strides(triton_ops):
    _, x, _, q, s = _case(10, 48, 40, torch.float32, bias=False, seed=2)
    x3 = torch.randn(2, 5, 96)[..., ::2]  # non-contiguous last dim, leading batch dims
    out = triton_ops.int8_linear(x3, q, s)
    exp = _oracle(x3.reshape(10, 48), q, s, None).reshape(2, 5, 40)
    assert (out.double() - exp).abs().max().item() <= 1e-5 * exp.abs().max().item()
