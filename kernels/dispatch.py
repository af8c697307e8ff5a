"""Choose the implementation of every op once, from the backend name and the device.

``auto``: CUDA tensors -> Triton; CPU -> ``cpu`` where its native library builds, else ``torch``.
``cpu``: native C++ paged attention (``cpu_native``, reads the paged cache in place), grouped
SGMV (each adapter's weights read once per step), INT4 weight-only matmuls that read the packed
codes for decode batches (``cpu_int4``), W8A8 matmuls (``w8a8``: native per-row quantizer and
epilogue around torch's int8 GEMM), linear layers over packed weights
(``cpu_packed.CpuLinearOps``: bf16 weights in oneDNN's blocked layout on CPUs with native bf16;
decode batches of a float32 model over a bf16 copy of bf16-exact weights), one-pass bf16 RMSNorm
SiLU x up and rotary embedding and the KV write (``cpu_elementwise``) + the torch reference
for everything else. ``torch``: always the plain reference (the oracle). ``triton``: always Triton (on CPU this needs TRITON_INTERPRET=1
set before triton is first imported; that is how CI exercises the kernels).
"""

from __future__ import annotations

import torch

from . import int4, int8, reference, w8a8
from .ops import KernelOps

BACKENDS = ("auto", "torch", "cpu", "triton")


TORCH_OPS = KernelOps(
    name="torch",
    write_kv=reference.write_kv,
    paged_decode_attention=reference.paged_decode_attention,
    paged_prefill_attention=reference.paged_prefill_attention,
    sgmv_shrink=reference.sgmv_shrink,
    sgmv_expand=reference.sgmv_expand,
    int8_linear=int8.int8_linear_cpu,
    int4_linear=int4.int4_linear_torch,
    w8a8_linear=w8a8.w8a8_linear_reference,
    pack_linear_weight=reference.pack_linear_weight,
    linear=reference.linear,
    rms_norm=reference.rms_norm,
    silu_mul=reference.silu_mul,
    rotary=reference.rotary,
)


def _cpu_ops() -> KernelOps | None:
    from . import cpu_elementwise, cpu_int4, cpu_native, cpu_packed, cpu_sgmv

    if not cpu_native.available():
        return None
    # Picked once, from the CPU's flags: bf16 weights packed for oneDNN where bf16 is native.
    linear_ops = cpu_packed.CpuLinearOps(cpu_packed.cpu_kind().name)
    return KernelOps(
        name="cpu",
        write_kv=cpu_elementwise.write_kv,
        paged_decode_attention=cpu_native.paged_decode_attention,
        paged_prefill_attention=cpu_native.paged_prefill_attention,
        sgmv_shrink=cpu_sgmv.sgmv_shrink,
        sgmv_expand=cpu_sgmv.sgmv_expand,
        int8_linear=int8.int8_linear_cpu,
        int4_linear=cpu_int4.int4_linear,
        w8a8_linear=w8a8.w8a8_linear_cpu,
        pack_linear_weight=linear_ops.pack_linear_weight,
        linear=linear_ops.linear,
        rms_norm=cpu_elementwise.rms_norm,
        silu_mul=cpu_elementwise.silu_mul,
        rotary=cpu_elementwise.rotary,
    )


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _triton_ops() -> KernelOps:
    # Imported lazily: importing triton is slow and the CPU path never needs it.
    from . import triton_ops

    return triton_ops.TRITON_OPS


def get_kernel_ops(backend: str = "auto", device: torch.device | str = "cpu") -> KernelOps:
    if backend not in BACKENDS:
        raise ValueError(f"kernel_backend must be one of {BACKENDS}, got {backend!r}")
    device = torch.device(device)
    if backend == "torch":
        return TORCH_OPS
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("kernel_backend='triton' but triton is not installed")
        return _triton_ops()
    if backend == "cpu":
        ops = _cpu_ops()
        if ops is None:
            raise RuntimeError("kernel_backend='cpu' but the native CPU kernels could not be built (see the warning)")
        return ops
    if device.type == "cuda" and triton_available():
        return _triton_ops()
    if device.type == "cpu":
        return _cpu_ops() or TORCH_OPS
    return TORCH_OPS
