"""The kernel ops' contracts: one Protocol per op signature, and ``KernelOps``, one implementation
of every op. Every backend (``reference``, ``cpu_native``/``cpu_packed``, ``triton_ops``) is typed
against these; ``dispatch`` only chooses among them (so a backend module imports this one, never
``dispatch``: no import cycle between the chooser and what it chooses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from . import pair_panels
from .int4 import Int4Weight
from .lora_meta import LoraSegments


class WriteKV(Protocol):
    def __call__(
        self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None: ...


class PagedDecodeAttention(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


class PagedPrefillAttention(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        query_start_loc: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


class SgmvShrink(Protocol):
    def __call__(
        self, x: torch.Tensor, lora_a: torch.Tensor, segments: LoraSegments, ranks: torch.Tensor
    ) -> torch.Tensor: ...


class SgmvExpand(Protocol):
    def __call__(
        self,
        y: torch.Tensor,
        shrunk: torch.Tensor,
        lora_b: torch.Tensor,
        segments: LoraSegments,
        ranks: torch.Tensor,
        scales: torch.Tensor,
        slice_offsets: tuple[int, ...],
    ) -> torch.Tensor: ...


class Int8Linear(Protocol):
    """INT8 weight-only matmul: x @ (qweight * scales[:, None]).T + bias, in x's dtype."""

    def __call__(
        self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor: ...


class W8A8Linear(Protocol):
    """W8A8 matmul (``w8a8``): x quantized to int8 per row at each call, int32 accumulation against
    int8 ``qweight`` [N, K], then ``acc * x_scale[row] * scales[col] + bias``, in x's dtype. A row's
    result never depends on the other rows of ``x``."""

    def __call__(
        self, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor: ...


class Int4Linear(Protocol):
    """INT4 weight-only matmul (group-wise, ``int4.Int4Weight``): x @ dequantize(weight).T + bias,
    in x's dtype."""

    def __call__(self, x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor: ...


class PackLinearWeight(Protocol):
    """A backend's own copy of a float linear weight for ``Linear`` (None: keep none)."""

    def __call__(self, weight: torch.Tensor) -> torch.Tensor | None: ...


class Linear(Protocol):
    """``x @ weight.T + bias``; ``packed`` is ``pack_linear_weight(weight)`` (None: read ``weight``).
    ``weight`` is None where the packed copy replaced it (``packed_replaces_weight``)."""

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, packed: torch.Tensor | None
    ) -> torch.Tensor: ...


class RmsNorm(Protocol):
    """HF's LlamaRMSNorm: ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)``, computed in fp32."""

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...


class Rotary(Protocol):
    """Rotate-half RoPE of ``x`` [T, heads, D] by the rows ``cos``/``sin`` [T, 1, D/2] of the
    tokens' positions: ``(x1*cos - x2*sin, x2*cos + x1*sin)``, rounded to x's dtype after each op."""

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor: ...


class SiluMul(Protocol):
    """``silu(gate) * up`` of a fused [T, 2n] gate|up projection output."""

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor: ...


def packed_replaces_weight(packed: torch.Tensor | None) -> bool:
    """True for a packed copy that holds every number of its weight and serves every batch size (an
    opaque oneDNN tensor, ``cpu_packed.pack_bf16``, or bf16 pair panels, ``pair_panels.pack``): the
    model may drop the plain weight. The float32 path's bf16 panels serve decode batches only,
    beside the float32 weight."""
    return packed is not None and (packed.is_mkldnn or pair_panels.is_packed(packed))


def replaced_weight(packed: torch.Tensor) -> torch.Tensor:
    """The [out, in] weight a copy that replaced it holds (``packed_replaces_weight``), read back:
    what ``F.linear`` needs where the copy's own kernel does not apply."""
    return packed.to_dense() if packed.is_mkldnn else pair_panels.unpack(packed)


@dataclass(frozen=True)
class KernelOps:
    """One implementation of every op; each field's Protocol is the op's exact signature, so a
    backend that drifts from the reference is a type error, not a runtime surprise."""

    name: str
    write_kv: WriteKV
    paged_decode_attention: PagedDecodeAttention
    paged_prefill_attention: PagedPrefillAttention
    sgmv_shrink: SgmvShrink
    sgmv_expand: SgmvExpand
    int8_linear: Int8Linear
    int4_linear: Int4Linear
    w8a8_linear: W8A8Linear
    pack_linear_weight: PackLinearWeight
    linear: Linear
    rms_norm: RmsNorm
    silu_mul: SiluMul
    rotary: Rotary
