"""Choose the implementation of every op once, from the backend name and the device.

``auto``: CUDA tensors -> Triton, anything else -> the torch reference.
``torch``: always the reference. ``triton``: always Triton (on CPU this needs TRITON_INTERPRET=1
set before triton is first imported; that is how CI exercises the kernels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import int8, reference

BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class KernelOps:
    name: str
    write_kv: Callable
    paged_decode_attention: Callable
    paged_prefill_attention: Callable
    sgmv_shrink: Callable
    sgmv_expand: Callable
    int8_linear: Callable  # (x, qweight int8 [N, K], scales f32 [N], bias) -> x @ (q*s).T + bias


TORCH_OPS = KernelOps(
    name="torch",
    write_kv=reference.write_kv,
    paged_decode_attention=reference.paged_decode_attention,
    paged_prefill_attention=reference.paged_prefill_attention,
    sgmv_shrink=reference.sgmv_shrink,
    sgmv_expand=reference.sgmv_expand,
    int8_linear=int8.int8_linear_cpu,
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
    if device.type == "cuda" and triton_available():
        return _triton_ops()
    return TORCH_OPS
