"""PEFT adapters for the peer benchmarks: rank-16 LoRA on every linear layer of a Llama-family
checkpoint (q, k, v, o, gate, up, down), random non-zero A and B, written directly in PEFT's file
format (creating dozens through peft would dominate the run). Written once per model into
``<model>/../peer-adapters-r16/`` and reused; both systems load the same files."""

from __future__ import annotations

import json
from pathlib import Path

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK = 16


def _write(out: Path, model_dir: Path, cfg: dict, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    q, kv, inter = heads * head_dim, cfg["num_key_value_heads"] * head_dim, cfg["intermediate_size"]
    shapes = {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for m in TARGETS:
            fan_in, fan_out = shapes[m]
            part = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{m}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, fan_in, generator=g) / fan_in**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, RANK, generator=g) * 0.02
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "target_modules": list(TARGETS),
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "base_model_name_or_path": str(model_dir),
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config))


def make_adapters(model_dir: str | Path, n: int) -> dict[str, str]:
    """name -> PEFT directory of ``n`` adapters (``lora0`` ..), written on first use."""
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    root = model_dir.parent / f"peer-adapters-r{RANK}"
    out = {}
    for i in range(n):
        d = root / f"lora{i}"
        if not (d / "adapter_model.safetensors").is_file():
            _write(d, model_dir, cfg, seed=i)
        out[f"lora{i}"] = str(d)
    return out
