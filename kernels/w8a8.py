"""W8A8 linear layers: int8 weights AND int8 activations, int32 accumulation (``quantization="w8a8"``).

Weights: per-output-channel symmetric int8, ``int8.quantize_per_channel_int8`` (the INT8
weight-only path's storage: ``qweight [N, K]`` int8, ``scales [N]`` float32).
Activations: quantized at each call, dynamically, PER ROW (per token): ``xs[m] = max_k |x[m, k]| /
127`` (1 for an all-zero row), ``xq = round_half_even(x / xs)`` clamped to +-127. One scale per row,
never per tensor: in a multi-tenant batch a token's numbers must not depend on which other tenants'
rows (and their outliers) share its batch (oneDNN's ``qlinear_pointwise`` takes one activation
scale per tensor, which is why it is not used).
Matmul: ``acc = xq @ qweight.T`` exactly in integers (|acc| <= 127 * 127 * K: int32 holds any K up
to 133,000), then ``y = float32(acc) * xs[m] * scales[n] (+ bias)``, rounded once to x's dtype.

Implementations:
  * ``w8a8_linear_reference`` (the torch backend, the oracle): quantizer in torch ops, the integer
    matmul in float64 (exact: every partial sum is an integer below 2^53), the rescale in float64;
  * ``w8a8_linear_cpu`` (the native CPU backend): the one-pass quantizer and epilogue of
    ``csrc/cpu_w8a8.cpp`` around ``torch._int_mm`` (oneDNN's int8 GEMM: AVX512-VNNI / AMX-INT8 where
    the CPU has them; torch's own loop where not), which computes the same int32 accumulators;
    without the native library, the quantizer and epilogue in torch ops.
No Triton kernel: on CUDA the triton backend runs the reference (float64 matmul: correct, slow).
"""

from __future__ import annotations

import ctypes

import torch

from . import cpu_native
from .profiler_range import profiler_range

QMAX = 127
# Elements below which the native quantizer / epilogue run on one thread: a 16 x 576 pass takes
# ~12 us on one core, and an OpenMP region for it cost ~50 us of CPU across two threads (measured,
# bf16, Zen 4, libiomp5).
PARALLEL_MIN_ELEMENTS = 1 << 16


def _threads(elements: int) -> int:
    return torch.get_num_threads() if elements >= PARALLEL_MIN_ELEMENTS else 1


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (any float dtype) -> (int8 codes ``[M, K]``, float32 scales ``[M]``), one scale
    per row: each row's codes depend on that row alone."""
    xf = x.float()
    amax = xf.abs().amax(dim=1) if xf.shape[1] else xf.new_zeros(xf.shape[0])
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(xf / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def int_matmul_exact(xq: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """``xq [M, K] @ qweight [N, K].T`` as int64, computed in float64 (exact for K < 2^38)."""
    return (xq.double() @ qweight.double().T).to(torch.int64)


def w8a8_linear_reference(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The oracle: per-row quantization, exact integer matmul, rescale in float64; x: [..., K]."""
    lead, k = x.shape[:-1], x.shape[-1]
    xq, xs = quantize_rows_int8(x.reshape(-1, k))
    acc = xq.double() @ qweight.double().T
    y = acc * xs.double()[:, None] * scales.double()
    if bias is not None:
        y = y + bias.double()
    return y.to(x.dtype).reshape(*lead, qweight.shape[0])


def _lib() -> ctypes.CDLL | None:
    return cpu_native._lib  # read at call time: tests swap in other builds


def quantize_rows_cpu(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows_int8`` in one native pass per row (float32 / bf16 rows on the CPU), else torch."""
    lib = _lib()
    m, k = x2.shape
    if lib is None or x2.device.type != "cpu" or x2.dtype not in (torch.float32, torch.bfloat16) or m == 0 or k == 0:
        return quantize_rows_int8(x2)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    q = torch.empty(m, k, dtype=torch.int8)
    s = torch.empty(m, dtype=torch.float32)
    fn = lib.lp_w8a8_quant_rows_f32 if x2.dtype == torch.float32 else lib.lp_w8a8_quant_rows_bf16
    with profiler_range("loraplex::cpu_w8a8_quant"):
        fn(x2.data_ptr(), x2.stride(0), m, k, q.data_ptr(), s.data_ptr(), _threads(m * k))
    return q, s


def int_mm_cpu(xq: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """int32 ``xq [M, K] @ qweight [N, K].T`` through ``torch._int_mm`` (exact integer arithmetic).
    The weight goes in as the transposed view of the [N, K] storage: measured faster at 1 row than a
    [K, N] copy (0.015 vs 0.036 ms, 576 x 1536) and the same from 16 rows up."""
    return torch._int_mm(xq, qweight.t())


def rescale_cpu(
    acc: torch.Tensor, xs: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """``float32(acc) * xs[m] * scales[n] (+ bias)`` rounded once to ``dtype``."""
    lib = _lib()
    b = None if bias is None else bias.float().contiguous()
    m, n = acc.shape
    if lib is None or acc.device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or m == 0 or n == 0:
        y = acc.float() * xs[:, None] * scales.float()
        return (y if b is None else y + b).to(dtype)
    out = torch.empty(m, n, dtype=dtype)
    ws = scales.float().contiguous()
    fn = lib.lp_w8a8_rescale_f32 if dtype == torch.float32 else lib.lp_w8a8_rescale_bf16
    with profiler_range("loraplex::cpu_w8a8_rescale"):
        fn(
            acc.contiguous().data_ptr(), m, n, xs.data_ptr(), ws.data_ptr(), None if b is None else b.data_ptr(),
            out.data_ptr(), _threads(m * n),
        )  # fmt: skip
    return out


def w8a8_linear_cpu(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Same contract as ``w8a8_linear_reference``, the int32 accumulators equal to its exactly."""
    if x.device.type != "cpu" or qweight.device.type != "cpu":
        return w8a8_linear_reference(x, qweight, scales, bias)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    xq, xs = quantize_rows_cpu(x2)
    with profiler_range("loraplex::cpu_w8a8_int_mm"):
        acc = int_mm_cpu(xq, qweight)
    return rescale_cpu(acc, xs, scales, bias, x.dtype).reshape(*lead, qweight.shape[0])
