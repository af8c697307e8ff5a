"""Triton INT8 weight-only GEMM: ``y[M, N] = (x[M, K] @ q[N, K].T) * s[N] (+ bias)``.

The weight tile is loaded as int8 (a quarter of fp32's bytes, half of bf16's: the saving that
matters when decode is bandwidth-bound), converted to the activation dtype in registers (exact for
|q| <= 127) and fed to ``tl.dot`` with fp32 accumulation; the per-channel scale is applied once to
the accumulator, after the reduction, since it does not depend on k.

Same contract as ``int8.int8_linear_reference``. Under ``TRITON_INTERPRET=1`` it runs on CPU tensors
(that is how the tests check it); bf16 there multiplies in fp32 (see ``triton_common.dot``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import dot, dot_in_f32


@triton.jit
def _int8_gemm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    q_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    sx_m,
    sx_k,
    sq_n,
    sq_k,
    sy_m,
    sy_n,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        xt = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * sx_m + offs_k[None, :] * sx_k,
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        qt = tl.load(  # [BLOCK_K, BLOCK_N]: q stored [N, K], read transposed
            q_ptr + offs_n[None, :].to(tl.int64) * sq_n + offs_k[:, None] * sq_k,
            mask=n_mask[None, :] & k_mask[:, None],
            other=0,
        )
        if PRECISE:  # int8 -> fp32 directly (the interpreter cannot convert int8 to bf16 bits)
            acc += dot(xt, qt.to(tl.float32), PRECISE)
        else:
            acc += dot(xt, qt.to(xt.dtype), PRECISE)
    scale = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)
    acc = acc * scale[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + offs_m[:, None].to(tl.int64) * sy_m + offs_n[None, :] * sy_n,
        acc.to(y_ptr.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


def _config(m: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K). Decode-sized M gets a short M tile (``tl.dot`` needs >= 16) and a
    wide N so the few rows still read each weight byte once; prefill-sized M a square-ish tile."""
    if m <= 16:
        return 16, 64, 128
    if m <= 64:
        return 32, 64, 64
    return 64, 64, 64


def int8_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    m, k = x2.shape
    n = qweight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    block_m, block_n, block_k = _config(m)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    scales = scales.float().contiguous()
    _int8_gemm_kernel[grid](
        x2,
        qweight,
        scales,
        bias if bias is not None else scales,
        y,
        m,
        n,
        k,
        x2.stride(0),
        x2.stride(1),
        qweight.stride(0),
        qweight.stride(1),
        y.stride(0),
        y.stride(1),
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PRECISE=dot_in_f32(x.dtype, x.device),
    )
    return y.reshape(*lead, n)
