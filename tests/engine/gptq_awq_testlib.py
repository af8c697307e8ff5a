"""GPTQ- and AWQ-layout 4-bit checkpoints of a tiny model, written here from the published formats
(independently of ``engine/models/quantized_checkpoint.py``, which reads them), and the oracle: the
plain HF model holding the float64 dequantization of exactly those codes.

Formats (``W [N out, K in]``, group of input column k: ``g_idx[k]``, normally ``k // group``;
``W[n, k] = (q[n, k] - zero[n, g]) * scale[n, g]``):
* GPTQ (AutoGPTQ / GPTQModel): ``qweight`` int32 ``[K / 8, N]``, word (i, n) holds input columns
  8i..8i+7 of output n, column 8i + j in bits 4j..4j+3; ``qzeros`` int32 ``[G, N / 8]``, word (g, w)
  holds outputs 8w..8w+7 the same way; ``scales`` fp16 ``[G, N]``; ``g_idx`` int32 ``[K]``.
  ``checkpoint_format`` "gptq" (v1, also what a config without the key means) stores
  ``clamp(zero - 1, 0, 15)``: a zero point of 0 cannot be stored, 16 can (stored 15), and readers
  add 1 back; "gptq_v2" stores the zero point itself (0..15).
* AWQ (AutoAWQ, ``version`` "gemm"): ``qweight`` int32 ``[K, N / 8]`` and ``qzeros`` int32
  ``[G, N / 8]`` both pack 8 consecutive OUTPUT columns per word, nibble j (bits 4j..4j+3) holding
  column ``AWQ_PACK_ORDER[j]`` of the 8; zero points stored as they are; ``scales`` fp16 ``[G, N]``.
Everything else (embedding, norms, head) is stored in fp16, as those tools leave it.
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's gemm packing: nibble j <- column ORDER[j]

# (lowest, highest) zero point each format can hold
ZERO_RANGE = {"gptq": (1, 16), "gptq_v2": (0, 15), "awq": (0, 15)}


def _as_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in 0..2^32-1 -> the int32 with the same bits (what the tools' int32 tensors hold)."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def rtn_quantize(
    w: torch.Tensor, g_idx: torch.Tensor, groups: int, zero_range: tuple[int, int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest 4-bit codes of ``w [N, K]`` (float64) for the column groups ``g_idx``:
    (q int64 [N, K] in 0..15, zero int64 [N, G], scale fp16 [N, G]). Every zero point of the format's
    range occurs (a few groups get a random one, the extremes included), so a reader that drops or
    misplaces the v1 offset, or a nibble, is wrong somewhere."""
    n, _ = w.shape
    lo_z, hi_z = zero_range
    gen = torch.Generator().manual_seed(seed)
    scale = torch.empty(n, groups, dtype=torch.float64)
    zero = torch.empty(n, groups, dtype=torch.int64)
    for g in range(groups):
        cols = w[:, g_idx == g]
        lo = cols.amin(dim=1).clamp(max=0)
        hi = cols.amax(dim=1).clamp(min=0)
        scale[:, g] = ((hi - lo) / 15).clamp(min=1e-4)
        zero[:, g] = torch.round(-lo / scale[:, g]).clamp(lo_z, hi_z).to(torch.int64)
    forced = torch.rand(n, groups, generator=gen) < 0.15
    zero = torch.where(forced, torch.randint(lo_z, hi_z + 1, (n, groups), generator=gen), zero)
    zero[0, 0], zero[1 % n, -1] = lo_z, hi_z
    scale16 = scale.to(torch.float16)
    s = scale16.double()[:, g_idx]
    q = torch.round(w / s + zero[:, g_idx]).clamp(0, 15).to(torch.int64)
    return q, zero, scale16


def dequantize(q: torch.Tensor, zero: torch.Tensor, scale16: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """float64 [N, K]: (q - zero) * scale, per column's group."""
    return (q.double() - zero.double()[:, g_idx]) * scale16.double()[:, g_idx]


def _pack_along_rows(values: torch.Tensor) -> torch.Tensor:
    """int64 [R, C] (4-bit values) -> int32 [R / 8, C]: rows 8i..8i+7 into word i, row 8i + j in nibble j."""
    r, c = values.shape
    v = values.view(r // 8, 8, c)
    words = sum(v[:, j] << (4 * j) for j in range(8))
    return _as_int32(words)


def _pack_columns(values: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """int64 [R, C] -> int32 [R, C / 8]: columns 8w..8w+7 into word w, nibble j holding column order[j]."""
    r, c = values.shape
    v = values.view(r, c // 8, 8)
    words = sum(v[:, :, order[j]] << (4 * j) for j in range(8))
    return _as_int32(words)


def pack_gptq(
    q: torch.Tensor, zero: torch.Tensor, scale16: torch.Tensor, g_idx: torch.Tensor, fmt: str
) -> dict[str, torch.Tensor]:
    stored = (zero - 1).clamp(0, 15) if fmt == "gptq" else zero
    return {
        "qweight": _pack_along_rows(q.T.contiguous()),  # [K, N] -> [K / 8, N]
        "qzeros": _pack_columns(stored.T.contiguous(), tuple(range(8))),  # [G, N] -> [G, N / 8]
        "scales": scale16.T.contiguous(),
        "g_idx": g_idx.to(torch.int32),
    }


def pack_awq(q: torch.Tensor, zero: torch.Tensor, scale16: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "qweight": _pack_columns(q.T.contiguous(), AWQ_PACK_ORDER),  # [K, N] -> [K, N / 8]
        "qzeros": _pack_columns(zero.T.contiguous(), AWQ_PACK_ORDER),  # [G, N] -> [G, N / 8]
        "scales": scale16.T.contiguous(),
    }


def quantization_config(fmt: str, group_size: int, desc_act: bool = False, static_groups: bool = False) -> dict:
    """``config.json``'s ``quantization_config`` as transformers / GPTQModel / AutoAWQ write it."""
    if fmt == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group_size,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        }
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group_size,
        "desc_act": desc_act,
        "static_groups": static_groups,
        "sym": False,
        "true_sequential": True,
        "damp_percent": 0.01,
        "lm_head": False,
        "pack_dtype": "int32",
        "checkpoint_format": fmt,
        "meta": {"quantizer": ["gptqmodel:2.2.0"]},
    }


def act_order_g_idx(k: int, group_size: int, seed: int) -> torch.Tensor:
    """An act-order (desc_act) g_idx: columns taken in a random order, groups cut along that order."""
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(k, dtype=torch.int64)
    g_idx[perm] = torch.arange(k) // group_size
    return g_idx


def write_quantized_checkpoint(
    base_dir: str,
    out_dir: Path,
    fmt: str,
    group_size: int,
    *,
    desc_act: bool = False,
    act_order: str | None = None,
    seed: int = 0,
) -> tuple[str, torch.nn.Module]:
    """The ``fmt`` ("gptq", "gptq_v2", "awq") checkpoint of the float checkpoint at ``base_dir``, and
    the HF model (float32) holding what it stands for. ``group_size`` -1: one group per row.
    ``act_order`` (GPTQ only): a permuted g_idx, "shared" by the projections that read one input
    (q/k/v, gate/up: what GPTQ computes, their Hessians being the same) or "per_module"."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for i, (name, module) in enumerate(model.named_modules()):
            if not (isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in DECODER_LINEARS):
                continue
            w = module.weight.double()
            k = w.shape[1]
            g = k if group_size == -1 else group_size
            if act_order:
                parent, leaf = name.rsplit(".", 1)
                reads = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(leaf, leaf)
                key = f"{parent}.{reads}" if act_order == "shared" else name
                g_idx = act_order_g_idx(k, g, seed + zlib.crc32(key.encode()))
            else:
                g_idx = torch.arange(k) // g
            groups = -(-k // g)
            q, zero, scale16 = rtn_quantize(w, g_idx, groups, ZERO_RANGE[fmt], seed + i)
            parts = pack_awq(q, zero, scale16) if fmt == "awq" else pack_gptq(q, zero, scale16, g_idx, fmt)
            tensors.update({f"{name}.{p}": t for p, t in parts.items()})
            if module.bias is not None:
                tensors[f"{name}.bias"] = module.bias.detach().to(torch.float16)
                module.bias.copy_(tensors[f"{name}.bias"].float())
            module.weight.copy_(dequantize(q, zero, scale16, g_idx).float())
        quantized = {n.rsplit(".", 1)[0] for n in tensors if n.endswith(".qweight")}
        for name, param in model.state_dict().items():
            if name.rsplit(".", 1)[0] in quantized:
                continue
            half = param.to(torch.float16)
            param.copy_(half.float())  # the oracle holds what the checkpoint stores
            tensors.setdefault(name, half.contiguous())
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for f in Path(base_dir).iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out_dir / f.name)
    config = json.loads((Path(base_dir) / "config.json").read_text())
    config["dtype"] = "float16"
    config["quantization_config"] = quantization_config(fmt, group_size, desc_act=desc_act)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return str(out_dir), model
