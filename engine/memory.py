"""Default KV-cache memory and batch size, sized from the device's free memory.

Used when ``EngineConfig.kv_cache_memory_gb`` / ``max_num_seqs`` are left as ``None``. On a GPU the
KV pool takes most of the memory the weights leave free (as vLLM's ``gpu_memory_utilization``
does); on a CPU the pool shares RAM with everything else on the host, so it takes a modest slice
of the available memory, and the batch stops at 64, past which a CPU step is compute-bound.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .models import ModelConfig

_GIB = 1 << 30
_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}

GPU_MEMORY_UTILIZATION = 0.85  # of the free memory at start, for weights + KV
GPU_ACTIVATION_RESERVE_GB = 1.0  # activations, logits, allocator slack
CPU_KV_FRACTION = 0.10  # of MemAvailable
CPU_KV_MIN_GB, CPU_KV_MAX_GB = 0.25, 4.0
MAX_SEQS = {"cpu": 64, "cuda": 256}
MIN_SEQS = 4
TOKENS_PER_SEQ_HINT = 512  # the batch is capped so each sequence can hold this much KV


def kv_bytes_per_token(mc: ModelConfig, dtype: torch.dtype) -> int:
    return 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * _BYTES[dtype]


def weight_bytes(model_dir: Path, mc: ModelConfig, dtype: torch.dtype) -> int:
    """Weights at ``dtype``, estimated from the checkpoint's file sizes."""
    on_disk = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    stored = _BYTES.get(mc.checkpoint_dtype, 4) if mc.checkpoint_dtype is not None else 4
    return on_disk * _BYTES[dtype] // stored


def available_host_bytes() -> int:
    """MemAvailable (free + reclaimable cache), or free physical pages where /proc is absent."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 * _GIB


def auto_kv_cache_gb(device: torch.device, model_dir: Path, mc: ModelConfig, dtype: torch.dtype) -> float:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = GPU_MEMORY_UTILIZATION * free - weight_bytes(model_dir, mc, dtype) - GPU_ACTIVATION_RESERVE_GB * _GIB
        return round(max(budget / _GIB, 0.25), 2)
    share = CPU_KV_FRACTION * available_host_bytes() / _GIB
    return round(min(max(share, CPU_KV_MIN_GB), CPU_KV_MAX_GB), 2)


def auto_max_num_seqs(device: torch.device, kv_tokens: int | None) -> int:
    cap = MAX_SEQS.get(device.type, MAX_SEQS["cpu"])
    if kv_tokens is None:
        return cap
    return max(MIN_SEQS, min(cap, kv_tokens // TOKENS_PER_SEQ_HINT))
