"""Turn a validated PEFT adapter into slot-ready tensors, one block per fused projection and layer.

PEFT keeps one (A, B) pair per Hugging Face module (q_proj, k_proj, ...); our model fuses q|k|v and
gate|up. A fused projection gets ONE rank per slot, so the slices are zero-padded to the largest
rank among them (zero rows contribute nothing) and a slice the adapter does not target stays zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import torch_threads
from ..models.config import ModelConfig
from .validate import SUPPORTED_MODULES, AdapterInfo, read_adapter

_FLOAT16_MAX = 65504.0  # beyond it float16 storage would turn a weight into inf

# Our fused projection -> its PEFT modules in slice order.
FUSED_MODULES: dict[str, tuple[str, ...]] = {}
for _peft_name, (_fused, _idx, _) in sorted(SUPPORTED_MODULES.items(), key=lambda kv: kv[1][1]):
    FUSED_MODULES.setdefault(_fused, ())
    FUSED_MODULES[_fused] += (_peft_name,)


@dataclass
class ProjectionLora:
    """What one adapter writes into one Projection's slot."""

    a: torch.Tensor  # [num_slices, rank, in_features]
    b: torch.Tensor  # [rank, total_out]
    rank: int
    scale: float


@dataclass
class LoadedAdapter:
    info: AdapterInfo
    # fused projection name -> per layer: the slot contents, or None when that layer is not targeted
    projections: dict[str, list[ProjectionLora | None]]

    @property
    def nbytes(self) -> int:
        return sum(
            p.a.numel() * p.a.element_size() + p.b.numel() * p.b.element_size()
            for layers in self.projections.values()
            for p in layers
            if p is not None
        )


def load_adapter(
    path: str | Path, mc: ModelConfig, max_lora_rank: int, dtype: torch.dtype, expected_sha256: str | None = None
) -> LoadedAdapter:
    """Validate and load ``path``. With ``expected_sha256``, refuse files that changed since the
    adapter was registered (a re-upload must come in through add_adapter, as a new version). Runs on
    a long-lived thread whatever thread calls it (``torch_threads``: a server calls it from
    short-lived ones)."""
    return torch_threads.run(_load_adapter, path, mc, max_lora_rank, dtype, expected_sha256)


def _load_adapter(
    path: str | Path, mc: ModelConfig, max_lora_rank: int, dtype: torch.dtype, expected_sha256: str | None
) -> LoadedAdapter:
    info, tensors = read_adapter(path, mc, max_lora_rank)
    if expected_sha256 is not None and info.sha256 != expected_sha256:
        from .validate import AdapterValidationError

        raise AdapterValidationError(
            f"adapter files at {info.path!r} changed since they were registered; add the adapter again"
        )
    return LoadedAdapter(info=info, projections=build_projections(info, tensors, mc, dtype))


def build_projections(
    info: AdapterInfo, tensors: dict[str, torch.Tensor], mc: ModelConfig, dtype: torch.dtype
) -> dict[str, list[ProjectionLora | None]]:
    scaling = {(m.layer, m.module): m.scaling for m in info.modules}
    h, i, q, kv = mc.hidden_size, mc.intermediate_size, mc.q_size, mc.kv_size
    layouts = {  # fused name -> (in_features, slice widths)
        "qkv_proj": (h, (q, kv, kv)),
        "o_proj": (q, (h,)),
        "gate_up_proj": (h, (i, i)),
        "down_proj": (i, (h,)),
    }
    out: dict[str, list[ProjectionLora | None]] = {}
    for fused, peft_names in FUSED_MODULES.items():
        fan_in, widths = layouts[fused]
        per_layer: list[ProjectionLora | None] = []
        for layer in range(mc.num_layers):
            present = [(n, idx) for idx, n in enumerate(peft_names) if (layer, n) in scaling]
            if not present:
                per_layer.append(None)
                continue
            rank = max(tensors[f"{layer}.{n}.A"].shape[0] for n, _ in present)
            scales = {scaling[(layer, n)] for n, _ in present}
            # One scale per slot and projection: when the slices disagree (alpha/rank patterns,
            # rsLoRA with mixed ranks) fold each slice's scaling into its B instead.
            shared = scales.pop() if len(scales) == 1 else None
            a = torch.zeros(len(peft_names), rank, fan_in, dtype=torch.float32)
            b = torch.zeros(rank, sum(widths), dtype=torch.float32)
            offset = 0
            for idx, n in enumerate(peft_names):
                if (layer, n) in scaling:
                    la, lb = tensors[f"{layer}.{n}.A"].float(), tensors[f"{layer}.{n}.B"].float()
                    r = la.shape[0]
                    a[idx, :r] = la
                    b[:r, offset : offset + widths[idx]] = lb.t() * (1.0 if shared is not None else scaling[(layer, n)])
                offset += widths[idx]
            if dtype == torch.float16 and max(a.abs().max().item(), b.abs().max().item()) > _FLOAT16_MAX:
                from .validate import AdapterValidationError

                raise AdapterValidationError(
                    f"adapter weights of layer {layer} {fused} exceed the float16 range (|w| > {_FLOAT16_MAX:g}); "
                    f"this engine stores adapters in float16 (lora_dtype): serve it with lora_dtype='model'"
                )
            per_layer.append(
                ProjectionLora(a=a.to(dtype), b=b.to(dtype), rank=rank, scale=shared if shared is not None else 1.0)
            )
        out[fused] = per_layer
    return out
