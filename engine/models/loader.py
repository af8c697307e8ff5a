"""Load a local Hugging Face safetensors checkpoint into our model (fusing q|k|v and gate|up).

A GPTQ/AWQ 4-bit checkpoint (``quantized_checkpoint``) loads the same way, except that each decoder
linear layer arrives as packed 4-bit tensors: they are unpacked, fused like float weights and
installed as the projection's int4 weight after the cast to ``dtype``."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig
from .layers import Projection, RotaryEmbedding
from .llama import LlamaForCausalLM
from .quantized_checkpoint import QuantizedCheckpoint, checkpoint_quantization, fuse_int4

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
    spec = checkpoint_quantization(path)
    quantized: dict[str, dict[str, torch.Tensor]] = {}  # HF module -> its qweight/qzeros/scales/g_idx
    for file in _checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                part = spec.split(name) if spec is not None else None
                if part is not None:
                    quantized.setdefault(part[0], {})[part[1]] = f.get_tensor(name)
                    continue
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
    expected = _expected_keys(model, cfg)
    if spec is not None:  # the projections' float weights come from the 4-bit tensors below
        expected = {k for k in expected if not k.split("[")[0].endswith("_proj.weight")}
    missing = expected - loaded
    if missing:
        raise ValueError(f"checkpoint {path} is missing {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
    if spec is None:
        return model.to(dtype=dtype).eval()
    projections = [m for m in model.modules() if isinstance(m, Projection)]
    for proj in projections:
        proj.weight = None  # the uninitialised float weight: never cast, never kept
    model = model.to(dtype=dtype).eval()
    _install_int4(model, cfg, spec, quantized, dtype)
    return model


def _install_int4(
    model: LlamaForCausalLM,
    cfg: ModelConfig,
    spec: QuantizedCheckpoint,
    quantized: dict[str, dict[str, torch.Tensor]],
    dtype: torch.dtype,
) -> None:
    """Each decoder projection's int4 weight from its HF modules' 4-bit tensors (fused in slice order)."""
    used: set[str] = set()
    for i in range(cfg.num_layers):
        by_ours: dict[str, list[tuple[int, str]]] = {}
        for hf, (ours, idx) in _LAYER_MAP.items():
            if ours.endswith("_proj"):
                by_ours.setdefault(ours, []).append((idx or 0, f"model.layers.{i}.{hf}"))
        for ours, hf_modules in by_ours.items():
            proj = model.get_submodule(f"layers.{i}.{ours}")
            assert isinstance(proj, Projection)
            slices, names = [], []
            for _, hf in sorted(hf_modules):
                if hf not in quantized:
                    raise ValueError(f"{cfg.name_or_path}: {spec.method} checkpoint has no 4-bit tensors for {hf}")
                unpacked = spec.to_int4(quantized[hf], hf)
                if unpacked[0].shape[1] < proj.in_features:
                    raise ValueError(
                        f"{hf}: 4-bit weight has {unpacked[0].shape[1]} inputs, the model {proj.in_features}"
                    )
                slices.append(unpacked)
                names.append(hf)
                used.add(hf)
            weight, perm = fuse_int4(spec, slices, proj.in_features, names)
            proj.set_int4(weight, dtype, perm)
    extra = sorted(set(quantized) - used)
    if extra:
        raise ValueError(f"unexpected 4-bit tensors in checkpoint, e.g. {extra[:3]}")


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
