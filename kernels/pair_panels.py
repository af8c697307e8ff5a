"""The "pair panels" layout of a bf16 linear weight, read by the vdpbf16ps kernel
(``csrc/cpu_linear_bf16.cpp``): [out, in] as [out / 16, in / 2, 16, 2], element [p][kk][j][t] =
W[16p + j][2kk + t]. One 64-byte row of it is what one AVX512-BF16 dot-product instruction takes:
16 output columns x 2 consecutive inputs.

Only whole panels: ``out`` a multiple of 16 and ``in`` even (every real model's projections and
heads); other shapes are not packed this way, so the layout's shape alone gives back the weight's
shape (``unpack``), and the copy can replace the plain weight. Pure torch, imported by the
reference ops too (which read a replaced weight back).
"""

from __future__ import annotations

import torch

PANEL = 16  # output columns per panel: one AVX-512 register of fp32 accumulators


def fits(weight: torch.Tensor) -> bool:
    """Whether ``weight`` [out, in] packs into whole pair panels."""
    if weight.dim() != 2:
        return False
    n, k = weight.shape
    return n > 0 and k > 0 and n % PANEL == 0 and k % 2 == 0


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [out / 16, in / 2, 16, 2] (a copy; the same numbers)."""
    assert fits(weight), f"pair panels need out % 16 == 0 and an even in, got {tuple(weight.shape)}"
    n, k = weight.shape
    return weight.detach().reshape(n // PANEL, PANEL, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def is_packed(t: torch.Tensor | None) -> bool:
    """A pair-panel copy (4-D, [.., .., 16, 2], bf16) — the float32 path's panels are 3-D."""
    return (
        t is not None
        and not t.is_mkldnn
        and t.dim() == 4
        and tuple(t.shape[2:]) == (PANEL, 2)
        and t.dtype == torch.bfloat16
    )


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] a pair-panel copy holds (the reference ops' view of it)."""
    p, k2, _, _ = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(p * PANEL, k2 * 2)
