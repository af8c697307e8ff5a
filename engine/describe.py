"""The engine's configuration as it actually runs: every ``auto`` resolved (device, dtype, KV
blocks, batch size). ``loraplex serve`` prints it at start, so nobody runs fp32-on-CPU unawares."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from loraplex.kernels import pair_panels

from . import runtime_env
from .llm_engine import LLMEngine
from .memory import kv_bytes_per_token


def resolved_config(engine: LLMEngine) -> dict[str, Any]:
    config, mc = engine.config, engine.model_config
    dtype = engine.runner.dtype
    kv_tokens = engine.kv.num_blocks * config.block_size
    return {
        "model": config.model,
        "architecture": mc.architecture,
        "device": str(engine.device),
        "dtype": str(dtype).removeprefix("torch."),
        "checkpoint_dtype": str(mc.checkpoint_dtype).removeprefix("torch.") if mc.checkpoint_dtype else None,
        "kernel_backend": engine.runner.ops.name,
        "linear_weights": linear_weights(engine.runner.model),
        "max_model_len": engine.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "prefill_group_tokens": config.prefill_group_tokens,
        "prefill_tokens_per_decode": config.prefill_tokens_per_decode,
        "block_size": config.block_size,
        "num_kv_blocks": engine.kv.num_blocks,
        "kv_cache_tokens": kv_tokens,
        "kv_cache_gb": round(kv_tokens * kv_bytes_per_token(mc, dtype) / (1 << 30), 3),
        "enable_prefix_caching": config.enable_prefix_caching,
        "scheduling_policy": config.scheduling_policy,
        "max_loras": config.max_loras,
        "max_lora_rank": config.max_lora_rank,
        "runtime": runtime_env.describe(),
    }


def linear_weights(model: torch.nn.Module) -> str:
    """Which copy the linear layers (and the head) read, counted: the CPU kind's choice made at
    load (``kernels/cpu_packed.py``), e.g. "pair panels x211" on an AVX512-BF16 CPU."""
    forms: Counter[str] = Counter()
    for module in model.modules():
        for attr in ("packed", "packed_head"):
            if not hasattr(module, attr):
                continue
            copy = getattr(module, attr)
            if copy is None:  # no copy: the plain float weight, or int8/int4 codes
                plain = module.weight is not None if attr == "packed" else module.quantized_head is None
                forms["plain" if plain else "quantized"] += 1
            elif pair_panels.is_packed(copy):
                forms["pair panels"] += 1
            elif copy.is_mkldnn:
                forms["oneDNN packed"] += 1
            else:
                forms["bf16 panels beside float32"] += 1
    return ", ".join(f"{form} x{n}" for form, n in forms.most_common()) or "plain"


def format_config(values: dict[str, Any]) -> str:
    width = max(len(k) for k in values)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in values.items())
