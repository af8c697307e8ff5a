"""loraplex.kernels — tensors in, tensors out. Knows nothing of sequences, adapters' names or tenants.

Ops (each has a plain-torch twin in ``reference`` and a Triton version in ``triton_ops``):
  write_kv, paged_decode_attention, paged_prefill_attention, sgmv_shrink, sgmv_expand.
Pick an implementation with ``get_kernel_ops(backend, device)``.
"""
from .dispatch import BACKENDS, KernelOps, TORCH_OPS, get_kernel_ops, triton_available
from .lora_meta import LoraSegments, make_lora_segments

__all__ = [
    "BACKENDS",
    "KernelOps",
    "TORCH_OPS",
    "LoraSegments",
    "get_kernel_ops",
    "make_lora_segments",
    "triton_available",
]
