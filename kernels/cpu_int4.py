"""INT4 weight-only linear layers on the native CPU kernels (``csrc/cpu_int4.cpp``).

Decode-sized batches (up to ``DIRECT_MAX_ROWS`` rows) read the packed 4-bit codes directly: the
weight bytes a decode step streams are 1/8 of float32's, and the kernel dequantizes in registers
(AVX-512F, AVX2+FMA, or a portable loop: whatever the library was built with). Larger batches
(prefill chunks) are compute-bound: the native library dequantizes the whole weight once per call
into float32 (one pass, OpenMP) and the dense GEMM (MKL/oneDNN) runs on it, its cost spread over
the chunk's rows.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from . import cpu_native
from .int4 import CHUNK, Int4Weight, int4_linear_torch
from .profiler_range import profiler_range

# Rows up to which reading the codes directly beats dequantize + dense GEMM; measured on an AVX2
# EPYC (benchmarks/engine/quantization_int4.py): the direct kernel re-dequantizes each weight once
# per 4-row tile, so its cost grows with the rows while the dense GEMM's per-row cost falls.
DIRECT_MAX_ROWS = 16


def isa(lib: ctypes.CDLL | None = None) -> str | None:
    """Which int4 path the (given or loaded) library runs: 'avx512', 'avx2', 'scalar'; None: no library."""
    lib = lib or cpu_native.load()
    if lib is None:
        return None
    return {2: "avx512", 1: "avx2", 0: "scalar"}[int(lib.lp_int4_isa())]


def _lib() -> ctypes.CDLL | None:
    # cpu_native._lib, read at call time: tests swap in a library built with other flags.
    return cpu_native._lib


def _padded_f32(x2: torch.Tensor, kp: int) -> torch.Tensor:
    """x [m, K] as contiguous float32 [m, kp], zero past K (the codes' padding then adds nothing)."""
    m, k = x2.shape
    if k == kp and x2.dtype == torch.float32 and x2.is_contiguous():
        return x2
    out = torch.zeros(m, kp, dtype=torch.float32) if k != kp else torch.empty(m, kp, dtype=torch.float32)
    out[:, :k] = x2
    return out


def dequantize(weight: Int4Weight, k: int, dtype: torch.dtype) -> torch.Tensor:
    """The weight [N, k] in ``dtype``, dequantized by the native library (float32, then cast)."""
    lib = _lib()
    assert lib is not None
    codes, scales, offsets = (t.contiguous() for t in weight)
    n, kp = codes.shape[0], codes.shape[1] * 2
    out = torch.empty(n, kp, dtype=torch.float32)
    lib.lp_int4_dequant_f32(
        codes.data_ptr(), scales.data_ptr(), offsets.data_ptr(), n, kp, weight.group_size, out.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    w = out[:, :k]
    return w if dtype == torch.float32 else w.to(dtype)


def int4_linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as ``int4.int4_linear_reference``: y = x @ W.T + bias in x's dtype."""
    lib = _lib()
    if lib is None or x.device.type != "cpu" or weight.codes.device.type != "cpu" or weight.group_size % CHUNK:
        return int4_linear_torch(x, weight, bias)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], weight.codes.shape[0]
    if m == 0:
        return x.new_empty(*lead, n)
    if m > DIRECT_MAX_ROWS:
        with profiler_range("loraplex::cpu_int4_dequant"):
            w = dequantize(weight, k, x.dtype)
        return F.linear(x2, w, None if bias is None else bias.to(x.dtype)).reshape(*lead, n)
    kp = weight.codes.shape[1] * 2
    xf = _padded_f32(x2, kp)
    codes, scales, offsets = (t.contiguous() for t in weight)
    b = None if bias is None else bias.float().contiguous()
    y = torch.empty(m, n, dtype=torch.float32)
    with profiler_range("loraplex::cpu_int4_linear"):
        lib.lp_int4_linear_f32(
            xf.data_ptr(), xf.stride(0), m, kp, codes.data_ptr(), scales.data_ptr(), offsets.data_ptr(), n,
            weight.group_size, None if b is None else b.data_ptr(), y.data_ptr(), y.stride(0),
            torch.get_num_threads(),
        )  # fmt: skip
    return y.to(x.dtype).reshape(*lead, n)
