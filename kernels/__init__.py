"""loraplex.kernels — tensors in, tensors out. Knows nothing of sequences, adapters' names or tenants.

Ops (each has a plain-torch twin in ``reference`` and a Triton version in ``triton_ops``):
  write_kv, paged_decode_attention, paged_prefill_attention, sgmv_shrink, sgmv_expand, int8_linear
  (INT8 weight-only matmul; its CPU path and oracle live in ``int8``), int4_linear (group-wise INT4
  weight-only; layout, quantizer and oracle in ``int4``, the native CPU path in ``cpu_int4``),
  w8a8_linear (int8 weights and per-row int8 activations, int32 accumulation; oracle and CPU path
  in ``w8a8``),
  pack_linear_weight + linear
  (a backend's own copy of a float weight and the matmul that reads it: on the native CPU kernels,
  bf16 panels of a bf16-exact float32 weight for decode-sized batches; the twins keep no copy),
  rms_norm + silu_mul (the decoder's element-wise glue: one pass per row for bf16 on the native CPU
  kernels; the torch twins elsewhere).
Pick an implementation with ``get_kernel_ops(backend, device)``.
"""

from .batch_invariant import ROW_TILE, BatchInvariantUnsupported, batch_invariant_ops
from .dispatch import BACKENDS, TORCH_OPS, get_kernel_ops, triton_available
from .int4 import CHUNK as INT4_CHUNK
from .int4 import (
    Int4Weight,
    check_group_size,
    dequantize_int4,
    int4_linear_reference,
    pack_int4,
    quantize_int4,
    unpack_int4_codes,
)
from .int8 import dequantize_int8, int8_linear_reference, quantize_per_channel_int8
from .lora_meta import LoraSegments, make_lora_segments
from .ops import KernelOps, packed_replaces_weight
from .w8a8 import quantize_rows_int8, w8a8_linear_reference

__all__ = [
    "BACKENDS",
    "ROW_TILE",
    "BatchInvariantUnsupported",
    "batch_invariant_ops",
    "KernelOps",
    "TORCH_OPS",
    "LoraSegments",
    "INT4_CHUNK",
    "Int4Weight",
    "check_group_size",
    "dequantize_int4",
    "int4_linear_reference",
    "pack_int4",
    "quantize_int4",
    "unpack_int4_codes",
    "dequantize_int8",
    "int8_linear_reference",
    "quantize_per_channel_int8",
    "quantize_rows_int8",
    "w8a8_linear_reference",
    "get_kernel_ops",
    "make_lora_segments",
    "packed_replaces_weight",
    "triton_available",
]
