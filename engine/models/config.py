"""Read a Hugging Face config.json into the few numbers our Llama-family model needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}

_HF_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope: dict = field(default_factory=dict)  # rope_type, rope_theta, and the type's parameters
    sliding_window: int | None = None
    checkpoint_dtype: torch.dtype | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    name_or_path: str = ""

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        raw = json.loads((path / "config.json").read_text())
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(f"unsupported architecture {archs!r}; loraplex serves {sorted(SUPPORTED_ARCHITECTURES)}")
        num_heads = raw["num_attention_heads"]
        hidden = raw["hidden_size"]
        rope = dict(raw.get("rope_parameters") or {})
        legacy_scaling = raw.get("rope_scaling") or {}
        rope.update({k: v for k, v in legacy_scaling.items() if k not in rope})
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        rope.setdefault("rope_type", "default")
        rope.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        gen_cfg = path / "generation_config.json"
        if gen_cfg.is_file():
            g = json.loads(gen_cfg.read_text()).get("eos_token_id")
            if g is not None:
                eos_ids = tuple(dict.fromkeys(eos_ids + (tuple(g) if isinstance(g, list) else (g,))))
        sliding = raw.get("sliding_window")
        if raw.get("use_sliding_window") is False:
            sliding = None
        model_type = SUPPORTED_ARCHITECTURES[arch]
        return cls(
            architecture=arch,
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or hidden // num_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama/Mistral only when attention_bias is set.
            attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
            rope=rope,
            sliding_window=sliding,
            checkpoint_dtype=_HF_DTYPES.get(raw.get("dtype") or raw.get("torch_dtype") or ""),
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            name_or_path=str(path),
        )
