"""PEFT-format LoRA adapters written directly (random non-zero A and B), for the engine benchmarks:
creating hundreds through peft would dominate the run. (The peer benchmarks' rank-16 adapters on
every linear layer are ``peer_adapters``.)"""

from __future__ import annotations

import json
from pathlib import Path

import torch

RANKS = (8, 16, 32, 64)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_peft_adapter(out: Path, base_dir: str, cfg: dict, rank: int, seed: int) -> str:
    """A PEFT-format LoRA directory (what ``PeftModel.save_pretrained`` writes), random non-zero
    A and B, written directly: creating hundreds through peft would dominate the run."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, cfg["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden)}
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for m in TARGETS:
            fan_in, fan_out = shapes[m]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{m}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.02
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": rank,
                "lora_alpha": 2 * rank,
                "target_modules": list(TARGETS),
                "lora_dropout": 0.0,
                "bias": "none",
                "use_rslora": False,
                "base_model_name_or_path": base_dir,
                "inference_mode": True,
            }
        )
    )
    return str(out)
