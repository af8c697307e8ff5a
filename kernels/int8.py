"""INT8 weight-only linear layers: per-output-channel symmetric quantization and the CPU matmul.

A weight ``W [N, K]`` is stored as ``q = round(W / s)`` in int8 (range -127..127, symmetric, so
zero stays exact) with one float32 scale per output channel, ``s[n] = max_k |W[n, k]| / 127``.
Then ``x @ W.T ~= (x @ q.T) * s``: the scale factors out of the reduction, so a kernel multiplies
int8 weights (converted to the activation dtype in registers, which is exact for |q| <= 127) by
the activations and scales the accumulated output once.

Two implementations here:
  * ``int8_linear_reference`` dequantizes in float32: the oracle every other path is tested against;
  * ``int8_linear_cpu``, the CPU serving path: decode-sized inputs (few rows) go through torch's
    ``_weight_int8pack_mm`` (an AVX-512 int8-weight x bf16 kernel that reads the int8 matrix directly,
    ~1/4 of the fp32 bytes: decode is memory-bound, so this is where weight-only int8 pays). That op
    is fast only for bf16 activations and few rows (measured, benchmarks/engine/quantization.py): fp32 and
    fp16 inputs run through it in bf16, and prefill-sized inputs (many rows, compute-bound) dequantize
    once into the activation dtype and run one dense GEMM, whose cost is then spread over many rows.
The GPU path is the Triton kernel in ``triton_int8``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

QMAX = 127
# Rows up to which _weight_int8pack_mm beats dequantize + dense GEMM on the CPUs we measured
# (AVX-512 BF16, 2 threads): it reads 1 byte per weight instead of 2-4, but its inner loop is a
# GEMV per row, so past a handful of rows the dense GEMM's blocking wins.
INT8PACK_MAX_ROWS = 16
# The op's vector loop reads K in steps of 16 without a tail: other K segfault (torch 2.13, checked
# for K in 16..1408). Every supported model's hidden/intermediate size is a multiple of 16.
INT8PACK_K_MULTIPLE = 16


def quantize_per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` (any float dtype) -> (int8 ``[N, K]``, float32 scales ``[N]``)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    # An all-zero row gets scale 1 (its codes are 0 anyway) instead of dividing by zero.
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize_int8(qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (qweight.float() * scales[:, None]).to(dtype)


def int8_linear_reference(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """y = x @ (q * s).T + bias, computed in float32, returned in x's dtype. x: [..., K]."""
    y = x.float() @ qweight.float().T * scales.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def int8_linear_cpu(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] <= INT8PACK_MAX_ROWS and x2.shape[1] % INT8PACK_K_MULTIPLE == 0:
        xb = x2.to(torch.bfloat16).contiguous()
        # Unit scales in the op, the float32 per-channel scale applied after: bf16 scales would
        # round each channel's scale by up to 2^-9, a systematic per-channel error.
        ones = _unit_scales(qweight.shape[0], x.device)
        y: torch.Tensor = torch.ops.aten._weight_int8pack_mm(xb, qweight, ones).to(x.dtype) * scales.to(x.dtype)
        if bias is not None:
            y = y + bias.to(x.dtype)
    else:
        y = F.linear(x2, dequantize_int8(qweight, scales, x.dtype), None if bias is None else bias.to(x.dtype))
    return y.reshape(*lead, qweight.shape[0])


_UNIT: dict[tuple[int, str], torch.Tensor] = {}


def _unit_scales(n: int, device: torch.device) -> torch.Tensor:
    key = (n, str(device))
    t = _UNIT.get(key)
    if t is None:
        t = _UNIT[key] = torch.ones(n, dtype=torch.bfloat16, device=device)
    return t
