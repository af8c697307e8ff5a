"""INT4 weight-only linear layers: group-wise asymmetric 4-bit codes, the packed layout, the oracle.

A weight ``W [N, K]`` is cut along K into groups of ``group_size`` columns; each (row, group) gets
``scale = (max - min) / 15`` and an integer zero point ``zero = round(-min / scale)`` in 0..15, and
each weight the code ``q = clamp(round(W / scale) + zero, 0, 15)``, so ``W ~= (q - zero) * scale``
(GPTQ's and AWQ's convention, which is why their checkpoints map onto it without re-rounding).

The packed layout (``Int4Weight``), what every kernel reads:
  * ``codes`` uint8 ``[N, Kp / 2]``: ``Kp`` is K padded to a multiple of the group size, and the
    group size a multiple of 32. Each 32-column chunk of a row is 16 bytes; byte j holds column j
    in its low nibble and column 16 + j in its high nibble: a 16-byte load splits into 16 + 16
    consecutive columns with one AND and one shift (``csrc/cpu_int4.cpp``). Padding codes are 0.
  * ``scales``, ``offsets`` float32 ``[N, Kp / group]``: ``weight = code * scale + offset`` with
    ``offset = -zero * scale`` (one FMA per weight in a kernel, and it also represents a GPTQ/AWQ
    checkpoint's zero points exactly up to float32 rounding).
The group size is implicit: ``Kp / scales.shape[1]``; K is the activation's last dimension.

Implementations: ``int4_linear_reference`` dequantizes in float32 (the oracle);
``int4_linear_torch`` dequantizes into the activation dtype and runs the dense GEMM (the torch
backend, and the prefill-sized path everywhere); ``cpu_int4.int4_linear`` reads the codes directly
for decode-sized batches on the native CPU kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

QMAX = 15
CHUNK = 32  # columns per 16-byte code chunk; every group size is a multiple of it
GROUP_SIZES = (32, 64, 128, 256)  # what EngineConfig accepts for quantization="int4"


class Int4Weight(NamedTuple):
    codes: torch.Tensor  # uint8 [N, Kp / 2]
    scales: torch.Tensor  # float32 [N, G]
    offsets: torch.Tensor  # float32 [N, G]

    @property
    def group_size(self) -> int:
        return self.codes.shape[1] * 2 // self.scales.shape[1]


def check_group_size(group_size: object) -> int:
    """The group size as an int, or a ValueError that says which sizes the kernels take."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < CHUNK or group_size % CHUNK:
        raise ValueError(
            f"int4 group size must be a positive multiple of {CHUNK} (e.g. {', '.join(map(str, GROUP_SIZES))}), "
            f"got {group_size!r}"
        )
    return group_size


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` -> (codes uint8 [N, K] in 0..15, scales float32 [N, G], zeros uint8 [N, G]),
    G = ceil(K / group_size); the last group may be partial (its statistics use its real columns)."""
    check_group_size(group_size)
    w = weight.detach().float()
    n, k = w.shape
    groups = -(-k // group_size)
    pad = groups * group_size - k
    # Padding with each row's last real value keeps a partial group's min/max those of its real columns.
    wp = torch.cat([w, w[:, -1:].expand(n, pad)], dim=1) if pad else w
    g = wp.view(n, groups, group_size)
    lo = g.amin(dim=2).clamp(max=0.0)  # the range includes 0, so zero is a valid code (exact zeros)
    hi = g.amax(dim=2).clamp(min=0.0)
    scale = (hi - lo) / QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero group: codes = zero
    zero = torch.round(-lo / scale).clamp(0, QMAX)
    q = torch.round(g / scale[:, :, None] + zero[:, :, None]).clamp(0, QMAX)
    codes = q.view(n, -1)[:, :k].to(torch.uint8)
    return codes.contiguous(), scale.contiguous(), zero.to(torch.uint8).contiguous()


def pack_int4(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> Int4Weight:
    """Unpacked codes [N, K] (0..15) with per-group float scales and integer (or float) zero points
    [N, G] -> the packed layout above."""
    check_group_size(group_size)
    n, k = codes.shape
    groups = -(-k // group_size)
    if tuple(scales.shape) != (n, groups) or tuple(zeros.shape) != (n, groups):
        raise ValueError(f"scales/zeros must be [{n}, {groups}] for K={k}, group {group_size}: {tuple(scales.shape)}")
    kp = groups * group_size
    q = torch.zeros(n, kp, dtype=torch.uint8)
    q[:, :k] = codes.to(torch.uint8)
    chunks = q.view(n, kp // CHUNK, 2, CHUNK // 2)  # [.., half, j]: column 16 * half + j of the chunk
    packed = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, kp // 2)
    s = scales.float()
    return Int4Weight(packed.contiguous(), s.contiguous(), (-zeros.float() * s).contiguous())


def unpack_int4_codes(codes: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """Packed codes [N, Kp / 2] -> uint8 [N, k] (default Kp) in 0..15."""
    n, half = codes.shape
    lo, hi = codes & 0x0F, codes >> 4
    q = torch.stack([lo.view(n, -1, CHUNK // 2), hi.view(n, -1, CHUNK // 2)], dim=2).reshape(n, half * 2)
    return q if k is None else q[:, :k]


def dequantize_int4(weight: Int4Weight, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [N, k] the codes stand for, computed in float32."""
    q = unpack_int4_codes(weight.codes).float()
    n, kp = q.shape
    g = weight.group_size
    w = q.view(n, kp // g, g) * weight.scales[:, :, None] + weight.offsets[:, :, None]
    return w.view(n, kp)[:, :k].to(dtype)


def int4_linear_reference(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ dequantize(weight).T + bias, computed in float32, returned in x's dtype. x: [..., K]."""
    y = x.float() @ dequantize_int4(weight, x.shape[-1]).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def int4_linear_torch(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize into x's dtype and run the dense GEMM (any device)."""
    w = dequantize_int4(weight, x.shape[-1], x.dtype)
    return F.linear(x, w, None if bias is None else bias.to(x.dtype))
