"""Load a local Hugging Face safetensors checkpoint into our model (fusing q|k|v and gate|up)."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig
from .layers import Projection, RotaryEmbedding
from .llama import LlamaForCausalLM

# HF name -> (our parameter path, slice index within a fused projection or None)
_LAYER_MAP = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "self_attn.o_proj": ("self_attn.o_proj", None),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
    "mlp.down_proj": ("mlp.down_proj", None),
    "input_layernorm": ("input_layernorm", None),
    "post_attention_layernorm": ("post_attention_layernorm", None),
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def _checkpoint_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        if list(path.glob("*.bin")) or list(path.glob("*.pt")):
            raise ValueError(f"{path}: only pickled weights found; loraplex loads safetensors only (never unpickles)")
        raise ValueError(f"{path}: no *.safetensors checkpoint files")
    return files


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device, max_positions: int) -> LlamaForCausalLM:
    path = Path(path)
    cfg = ModelConfig.from_dir(path)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, max_positions)
    model = model.to_empty(device=device)
    # The rotary cos/sin tables are computed, not loaded: rebuild them off the meta device.
    rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope).to(device)
    for layer in model.decoder_layers():
        layer.self_attn.rotary = rotary
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file in _checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                target = _target(name, cfg)
                if target is None:
                    continue
                param_name, slice_idx = target
                if param_name not in params:
                    raise ValueError(f"{file.name}: unexpected tensor {name}")
                param = params[param_name]
                tensor = f.get_tensor(name)
                if slice_idx is not None:
                    proj = model.get_submodule(param_name.rsplit(".", 1)[0])
                    assert isinstance(proj, Projection)
                    lo, hi = proj.slice_offsets[slice_idx], proj.slice_offsets[slice_idx + 1]
                    dest = param.data[lo:hi]
                    key = f"{param_name}[{slice_idx}]"
                else:
                    dest, key = param.data, param_name
                if tuple(dest.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(dest.shape)}"
                    )
                dest.copy_(tensor.to(dtype=dest.dtype))
                loaded.add(key)
    missing = _expected_keys(model, cfg) - loaded
    if missing:
        raise ValueError(f"checkpoint {path} is missing {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
    return model.to(dtype=dtype).eval()


def _target(name: str, cfg: ModelConfig) -> tuple[str, int | None] | None:
    if name == "model.embed_tokens.weight":
        return "embed_tokens.weight", None
    if name == "model.norm.weight":
        return "norm.weight", None
    if name == "lm_head.weight":
        return None if cfg.tie_word_embeddings else ("lm_head.weight", None)
    m = _LAYER_RE.match(name)
    if not m:
        if name.endswith("rotary_emb.inv_freq"):
            return None
        raise ValueError(f"unexpected tensor {name} in checkpoint")
    layer, module, kind = m.groups()
    if module not in _LAYER_MAP:
        if module.endswith("rotary_emb"):
            return None
        raise ValueError(f"unexpected tensor {name} in checkpoint")
    ours, idx = _LAYER_MAP[module]
    return f"layers.{layer}.{ours}.{kind}", idx


def _expected_keys(model: LlamaForCausalLM, cfg: ModelConfig) -> set[str]:
    keys: set[str] = set()
    for name, _ in model.named_parameters():
        module_path, kind = name.rsplit(".", 1)
        if module_path.endswith(("qkv_proj", "gate_up_proj")):
            n = 3 if module_path.endswith("qkv_proj") else 2
            keys.update(f"{name}[{i}]" for i in range(n))
        else:
            keys.add(name)
    return keys
