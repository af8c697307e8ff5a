"""4-bit checkpoints in GPTQ's or AWQ's published layout, read into ``kernels.int4``'s.

``config.json`` says which: ``quantization_config = {"quant_method": "gptq" | "awq", "bits": 4,
"group_size": g, ...}``. Each quantized linear ``<module>`` is stored as four tensors instead of
``<module>.weight`` (W [N out, K in], group of column k = k // g, G = ceil(K / g) groups):

* GPTQ (AutoGPTQ / GPTQModel, ``checkpoint_format`` "gptq"): ``qweight`` int32 [K / 8, N], 8 codes
  of consecutive input columns per word (column 8i + j in bits 4j..4j+3); ``qzeros`` int32
  [G, N / 8], 8 consecutive output columns per word the same way, each stored as zero - 1 (the
  format's historical offset; "gptq_v2" stores the zero itself); ``scales`` fp16 [G, N];
  ``g_idx`` int32 [K], each input column's group.
* AWQ (AutoAWQ "gemm"): ``qweight`` int32 [K, N / 8] and ``qzeros`` int32 [G, N / 8], both packing
  8 consecutive OUTPUT columns per word in the interleaved order 0 2 4 6 1 3 5 7 (bits 4j..4j+3
  hold column ``AWQ_ORDER[j]`` of the 8), zeros without offset; ``scales`` fp16 [G, N]; no g_idx.

Both mean ``W[n, k] = (q[n, k] - zero[n, g]) * scale[n, g]``, which ``int4.pack_int4`` takes as
is: the codes are the checkpoint's, not re-quantized. Not supported (a clear error at load): bits
other than 4, group sizes that are not a multiple of 32 (the kernels' chunk), GPTQ act-order
(``desc_act``: a g_idx that is not k // g would need a column permutation per projection), and
AWQ's "gemv" packing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from loraplex.kernels import INT4_CHUNK, Int4Weight, check_group_size, pack_int4

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # word nibble j holds output column AWQ_ORDER[j] of its 8
PARTS = ("qweight", "qzeros", "scales", "g_idx")
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


@dataclass(frozen=True)
class QuantizedCheckpoint:
    method: str  # "gptq" | "awq"
    group_size: int  # -1: one group per row (all of K)
    zero_offset: int  # added to every stored zero point (GPTQ's "gptq" format: 1)

    def split(self, name: str) -> tuple[str, str] | None:
        """``model.layers.0.self_attn.q_proj.qweight`` -> (``model.layers.0.self_attn.q_proj``,
        ``qweight``); None for a tensor that is not part of a quantized linear layer."""
        module, _, part = name.rpartition(".")
        return (module, part) if part in PARTS and module else None

    def to_int4(self, parts: dict[str, torch.Tensor], module: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer's tensors -> (codes uint8 [N, K], scales float32 [N, G], zeros float32 [N, G])."""
        missing = [p for p in ("qweight", "qzeros", "scales") if p not in parts]
        if missing:
            raise ValueError(f"{module}: quantized layer without {missing}")
        if self.method == "gptq":
            return unpack_gptq(parts["qweight"], parts["qzeros"], parts["scales"], parts.get("g_idx"),
                               self.group_size, self.zero_offset, module)  # fmt: skip
        return unpack_awq(parts["qweight"], parts["qzeros"], parts["scales"])

    def kernel_group_size(self, k: int) -> int:
        """The group size ``pack_int4`` gets for an input size ``k`` (-1: one group of all of K)."""
        if self.group_size == -1:
            return -(-k // INT4_CHUNK) * INT4_CHUNK
        return self.group_size


def checkpoint_quantization(path: str | Path) -> QuantizedCheckpoint | None:
    """The checkpoint's 4-bit layout from its config.json; None for a float checkpoint."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    qc = json.loads(cfg.read_text()).get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method not in ("gptq", "awq"):
        raise ValueError(f"{path}: quantization_config.quant_method {method!r} is not supported (gptq, awq)")
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{path}: {method} with bits={bits!r}; loraplex serves 4-bit checkpoints only")
    group = qc.get("group_size", qc.get("q_group_size", -1))
    if group != -1:
        try:
            check_group_size(group)
        except ValueError as exc:
            raise ValueError(f"{path}: {method} group_size: {exc}") from None
    if method == "gptq":
        if qc.get("desc_act"):
            raise ValueError(f"{path}: GPTQ act-order (desc_act) checkpoints are not supported")
        fmt = qc.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"{path}: GPTQ checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
        return QuantizedCheckpoint("gptq", group, 1 if fmt == "gptq" else 0)
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm" or qc.get("zero_point", True) is False:
        raise ValueError(
            f"{path}: AWQ version {version!r} / zero_point {qc.get('zero_point')!r}: only gemm with zero points"
        )
    return QuantizedCheckpoint("awq", group, 0)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> int32 [..., W, 8]: nibble j of each word (bits 4j..4j+3)."""
    return (words.to(torch.int32)[..., None] >> _SHIFTS) & 0xF


def _group_of(k: int, group_size: int) -> torch.Tensor:
    return torch.arange(k, dtype=torch.int32) // (k if group_size == -1 else group_size)


def unpack_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    zero_offset: int,
    module: str = "",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k8, n = qweight.shape
    k = k8 * 8
    # [K/8, N, 8] -> [K/8, 8, N] -> [K, N]: input column 8i + j is nibble j of row i.
    codes = _nibbles(qweight).permute(0, 2, 1).reshape(k, n).T
    zeros = _nibbles(qzeros).reshape(qzeros.shape[0], -1)[:, :n].T.float() + zero_offset  # [N, G]
    if g_idx is not None and not torch.equal(g_idx.to(torch.int32), _group_of(k, group_size)):
        raise ValueError(f"{module}: g_idx is not k // group_size (act-order GPTQ is not supported)")
    return _checked(codes, scales.float().T, zeros, k, group_size, module)


def unpack_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    where = torch.tensor([AWQ_ORDER.index(c) for c in range(8)])  # column c of 8 sits in nibble where[c]
    k = qweight.shape[0]
    codes = _nibbles(qweight)[..., where].reshape(k, -1).T  # [N, K]
    zeros = _nibbles(qzeros)[..., where].reshape(qzeros.shape[0], -1).T.float()  # [N, G]
    return codes, scales.float().T, zeros


def _checked(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, k: int, group_size: int, module: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups = 1 if group_size == -1 else -(-k // group_size)
    if scales.shape[1] != groups or zeros.shape != scales.shape:
        raise ValueError(f"{module}: {groups} groups expected for K={k}, scales {tuple(scales.shape)}")
    return codes, scales, zeros


def fuse_int4(
    spec: QuantizedCheckpoint, slices: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], k: int
) -> Int4Weight:
    """The unpacked slices of one fused projection (q|k|v, gate|up: concatenated along N), packed."""
    codes = torch.cat([c[:, :k] for c, _, _ in slices])
    scales = torch.cat([s for _, s, _ in slices])
    zeros = torch.cat([z for _, _, z in slices])
    return pack_int4(codes, scales, zeros, spec.kernel_group_size(k))
