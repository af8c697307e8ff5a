"""A bf16 decoder layer's element-wise glue on the native CPU library (``csrc/cpu_elementwise.cpp``):
RMSNorm, SiLU(gate) x up and the rotary embedding in one pass each, and the KV-cache write as one
copy per token. Each is its torch twin in ``reference`` (the torch backend and the oracle) to the bit
or, for RMSNorm and SiLU, within a bf16 ulp; inputs the kernels do not take (float32, other
layouts) go to the twin."""

from __future__ import annotations

import torch

from . import cpu_native, reference
from .profiler_range import profiler_range


def _bf16_rows(t: torch.Tensor) -> bool:
    return (
        cpu_native._lib is not None and t.dtype == torch.bfloat16 and t.device.type == "cpu" and t.dim() == 2
        and t.stride(-1) == 1 and t.shape[0] > 0
    )  # fmt: skip


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``reference.rms_norm`` in one pass per row (``csrc/cpu_elementwise.cpp``) for bf16 rows with
    a bf16 weight; float32 (and anything else) keeps the torch twin: a float32 model is compared
    with HF transformers token for token, and its glue is a small share of its step."""
    if not (_bf16_rows(x) and weight.dtype == torch.bfloat16 and weight.dim() == 1 and weight.shape[0] == x.shape[1]):
        return reference.rms_norm(x, weight, eps)
    assert cpu_native._lib is not None
    w = weight.contiguous()
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    with profiler_range("loraplex::cpu_rms_norm"):
        cpu_native._lib.lp_rms_norm_bf16(
            x.data_ptr(),
            x.stride(0),
            x.shape[0],
            x.shape[1],
            w.data_ptr(),
            eps,
            out.data_ptr(),
            torch.get_num_threads(),
        )
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``reference.silu_mul`` in one pass per row for bf16 rows (float32: the torch twin)."""
    if not (_bf16_rows(gate_up) and gate_up.shape[1] % 2 == 0):
        return reference.silu_mul(gate_up)
    assert cpu_native._lib is not None
    n = gate_up.shape[1] // 2
    out = torch.empty(gate_up.shape[0], n, dtype=torch.bfloat16)
    with profiler_range("loraplex::cpu_silu_mul"):
        cpu_native._lib.lp_silu_mul_bf16(
            gate_up.data_ptr(), gate_up.stride(0), gate_up.shape[0], n, out.data_ptr(), torch.get_num_threads()
        )
    return out


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``reference.rotary`` in one pass for bf16 rows whose heads are dense (the fused q|k columns
    of a qkv projection are: rows are strided, heads within a row are not); bit for bit the same
    numbers (each product and sum rounded to bf16 as torch's ops round them). Anything else: the
    torch twin."""
    if not (
        cpu_native._lib is not None and x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.dim() == 3
        and x.shape[0] > 0 and x.shape[2] % 2 == 0 and x.stride(2) == 1 and x.stride(1) == x.shape[2]
        and cos.dtype == torch.bfloat16 and sin.dtype == torch.bfloat16
        and cos.shape == sin.shape == (x.shape[0], 1, x.shape[2] // 2)
    ):  # fmt: skip
        return reference.rotary(x, cos, sin)
    rows, heads, d = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(rows, heads, d, dtype=torch.bfloat16)
    with profiler_range("loraplex::cpu_rotary"):
        cpu_native._lib.lp_rotary_bf16(
            x.data_ptr(), x.stride(0), rows, heads, d, cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
    return out


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """``reference.write_kv`` as one native copy per token where k and v already have the caches'
    dtype and each token's [heads, d] is dense (a view of the qkv projection's columns is); the
    torch twin otherwise."""
    if not (
        cpu_native._lib is not None and k_cache.device.type == "cpu" and k_cache.is_contiguous() and v_cache.is_contiguous()
        and k.dtype == v.dtype == k_cache.dtype == v_cache.dtype and k.dim() == v.dim() == 3
        and k.shape == v.shape and k.shape[1:] == k_cache.shape[2:] and v_cache.shape == k_cache.shape
        and k.stride(2) == v.stride(2) == 1 and k.stride(1) == v.stride(1) == k.shape[2]
        and slot_mapping.shape == (k.shape[0],)
    ):  # fmt: skip
        reference.write_kv(k_cache, v_cache, k, v, slot_mapping)
        return
    slots = slot_mapping.to(torch.int64).contiguous()
    esize = k.element_size()
    cpu_native._lib.lp_write_kv(
        k_cache.data_ptr(), v_cache.data_ptr(), k.data_ptr(), k.stride(0) * esize, v.data_ptr(), v.stride(0) * esize,
        slots.data_ptr(), k.shape[0], k.shape[1] * k.shape[2] * esize,
    )  # fmt: skip
