"""The Triton implementation of every kernel op, same signatures as ``reference``.

Imported lazily by ``dispatch`` (importing triton is slow). On CPU tensors these kernels only run
under ``TRITON_INTERPRET=1`` set before triton is first imported.

Optional keyword-only extras (the engine may pass them; defaults keep the reference signatures):
  sgmv_shrink(..., out=buf)                         reuse a float32 output buffer
  paged_decode_attention(..., max_context_len=n)    bound for the split count (default from shapes)
  paged_prefill_attention(..., max_query_len=n)     avoids one host sync to size the grid
"""

from __future__ import annotations

from . import reference
from .int4 import int4_linear_torch
from .ops import KernelOps
from .triton_decode_attention import paged_decode_attention
from .triton_int8 import int8_linear
from .triton_kv_write import write_kv
from .triton_prefill_attention import paged_prefill_attention
from .triton_sgmv import sgmv_expand, sgmv_shrink
from .w8a8 import w8a8_linear_reference

TRITON_OPS = KernelOps(
    name="triton",
    write_kv=write_kv,
    paged_decode_attention=paged_decode_attention,
    paged_prefill_attention=paged_prefill_attention,
    sgmv_shrink=sgmv_shrink,
    sgmv_expand=sgmv_expand,
    int8_linear=int8_linear,
    int4_linear=int4_linear_torch,  # no Triton int4 kernel yet: dequantize + cuBLAS
    w8a8_linear=w8a8_linear_reference,  # no Triton w8a8 kernel: the float64 oracle (correct, slow)
    pack_linear_weight=reference.pack_linear_weight,  # cuBLAS reads the weight itself
    linear=reference.linear,
    rms_norm=reference.rms_norm,
    silu_mul=reference.silu_mul,
    rotary=reference.rotary,
)
