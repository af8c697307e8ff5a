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
is: the codes are the checkpoint's, not re-quantized. GPTQ v1's offset: a stored zero s means s + 1
(1..16, as the GPTQ kernels of AutoGPTQ/exllama/vLLM read it: v1 cannot hold a zero point of 0, and
a stored 15 is a zero point of 16, which the float offsets hold exactly); v2's zero points are 0..15.

Supported: bits 4; group sizes that are multiples of 32 (the kernels' chunk) or -1 (one group per
row); GPTQ "gptq" (also what a config without ``checkpoint_format`` means) and "gptq_v2"; GPTQ
act-order (``desc_act``): a ``g_idx`` of k // group (static groups) is an ordinary checkpoint, and a
permuted one whose groups are runs of ``group`` columns in some input order (what act-order
writes) is served by storing the codes in that order and permuting the projection's input to it
(``Projection.q4_perm``; the fused q|k|v and gate|up slices must share the order, as GPTQ gives
projections that read one input); AWQ "gemm" with zero points. Refused with an error naming the
layer or the config key: other bits, group sizes, methods, GPTQ formats (marlin...) and AWQ
versions (gemv), AWQ without zero points, a ``g_idx`` that cuts no such groups, fused slices with
different orders, ``desc_act`` without ``g_idx``, tensors of the wrong dtype or shape.
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
# (codes [N, K], scales [N, G], zeros [N, G], input permutation [K] or None)
Unpacked = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class QuantizedCheckpoint:
    method: str  # "gptq" | "awq"
    group_size: int  # -1: one group per row (all of K)
    zero_offset: int  # added to every stored zero point (GPTQ's "gptq" format: 1)
    act_order: bool = False  # GPTQ desc_act: every layer must carry its g_idx

    def split(self, name: str) -> tuple[str, str] | None:
        """``model.layers.0.self_attn.q_proj.qweight`` -> (``model.layers.0.self_attn.q_proj``,
        ``qweight``); None for a tensor that is not part of a quantized linear layer."""
        module, _, part = name.rpartition(".")
        return (module, part) if part in PARTS and module else None

    def to_int4(self, parts: dict[str, torch.Tensor], module: str) -> Unpacked:
        """One layer's tensors -> (codes [N, K], scales float32 [N, G], zeros float32 [N, G], the
        input permutation [K] the codes are stored in, or None)."""
        missing = [p for p in ("qweight", "qzeros", "scales") if p not in parts]
        if missing:
            raise ValueError(f"{module}: quantized layer without {missing}")
        for p, t in parts.items():
            if p != "scales" and t.dtype != torch.int32:
                raise ValueError(f"{module}.{p}: {self.method} stores int32, got {t.dtype}")
        if self.method == "gptq":
            if self.act_order and "g_idx" not in parts:
                raise ValueError(f"{module}: desc_act checkpoint without g_idx")
            return unpack_gptq(parts["qweight"], parts["qzeros"], parts["scales"], parts.get("g_idx"),
                               self.group_size, self.zero_offset, module)  # fmt: skip
        return (*unpack_awq(parts["qweight"], parts["qzeros"], parts["scales"], self.group_size, module), None)

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
        fmt = qc.get("checkpoint_format") or "gptq"
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"{path}: GPTQ checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
        # desc_act alone is no reason to refuse: with static groups its g_idx is k // group. Each
        # layer's g_idx is checked at unpacking; act_order makes a layer without one an error.
        return QuantizedCheckpoint("gptq", group, 1 if fmt == "gptq" else 0, bool(qc.get("desc_act")))
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
) -> Unpacked:
    k8, n = _shape(qweight, 2, f"{module}.qweight")
    k = k8 * 8
    groups = _groups(k, group_size)
    _expect(scales, (groups, n), f"{module}.scales", f"[groups, N] for K={k}, group_size {group_size}")
    _expect(qzeros, (groups, -(-n // 8)), f"{module}.qzeros", f"[groups, N / 8] for K={k}, N={n}")
    perm = None
    if g_idx is not None:
        _expect(g_idx, (k,), f"{module}.g_idx", f"[K] for K={k}")
        perm = _act_order_permutation(g_idx.to(torch.int64), k, group_size, groups, module)
    # [K/8, N, 8] -> [K/8, 8, N] -> [K, N]: input column 8i + j is nibble j of row i.
    codes = _nibbles(qweight).permute(0, 2, 1).reshape(k, n).T
    zeros = _nibbles(qzeros).reshape(groups, -1)[:, :n].T.float() + zero_offset  # [N, G]
    if perm is not None:
        codes = codes[:, perm]  # groups contiguous: the kernels' layout
    return codes, scales.float().T, zeros, perm


def _act_order_permutation(
    g_idx: torch.Tensor, k: int, group_size: int, groups: int, module: str
) -> torch.Tensor | None:
    """None when ``g_idx`` is k // group (the columns' own order); otherwise the input order in which
    the groups are contiguous runs of ``group_size`` columns (act-order GPTQ cut its groups along its
    permuted order), or an error for a g_idx no such order explains."""
    if torch.equal(g_idx, _group_of(k, group_size).to(torch.int64)):
        return None
    g = k if group_size == -1 else group_size
    expected = torch.full((groups,), g, dtype=torch.int64)
    expected[-1] = k - g * (groups - 1)
    if g_idx.min() < 0 or g_idx.max() >= groups or not torch.equal(torch.bincount(g_idx, minlength=groups), expected):
        raise ValueError(
            f"{module}: g_idx does not cut the inputs into groups of {g} columns (in any order): not a "
            "GPTQ act-order layout loraplex can serve"
        )
    return torch.sort(g_idx, stable=True).indices


def unpack_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int, module: str = ""
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k, n8 = _shape(qweight, 2, f"{module}.qweight")
    n = n8 * 8
    groups = _groups(k, group_size)
    _expect(scales, (groups, n), f"{module}.scales", f"[groups, N] for K={k}, group_size {group_size}, N={n}")
    _expect(qzeros, (groups, n8), f"{module}.qzeros", f"[groups, N / 8] for K={k}, N={n}")
    where = torch.tensor([AWQ_ORDER.index(c) for c in range(8)])  # column c of 8 sits in nibble where[c]
    codes = _nibbles(qweight)[..., where].reshape(k, n).T  # [N, K]
    zeros = _nibbles(qzeros)[..., where].reshape(groups, n).T.float()  # [N, G]
    return codes, scales.float().T, zeros


def _groups(k: int, group_size: int) -> int:
    return 1 if group_size == -1 else -(-k // group_size)


def _shape(t: torch.Tensor, dims: int, name: str) -> tuple[int, ...]:
    if t.dim() != dims:
        raise ValueError(f"{name}: {dims}-d tensor expected, got shape {tuple(t.shape)}")
    return tuple(t.shape)


def _expect(t: torch.Tensor, shape: tuple[int, ...], name: str, what: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {list(shape)} ({what})")


def _same_order(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a, b)


def fuse_int4(
    spec: QuantizedCheckpoint, slices: list[Unpacked], k: int, names: list[str] | None = None
) -> tuple[Int4Weight, torch.Tensor | None]:
    """The unpacked slices of one fused projection (q|k|v, gate|up: concatenated along N), packed,
    and their common input permutation (act-order GPTQ; the slices read one input, so one order)."""
    perms = [p for *_, p in slices]
    first = perms[0]
    if any(not _same_order(p, first) for p in perms):
        raise ValueError(
            f"{', '.join(names or [])}: act-order GPTQ slices of one fused projection with different input "
            "orders (g_idx): not supported"
        )
    codes = torch.cat([c[:, :k] for c, _, _, _ in slices])
    scales = torch.cat([s for _, s, _, _ in slices])
    zeros = torch.cat([z for _, _, z, _ in slices])
    return pack_int4(codes, scales, zeros, spec.kernel_group_size(k)), first
