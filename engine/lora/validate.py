"""Check a PEFT LoRA adapter directory against the base model before anything serves it.

Only what we can serve exactly is accepted: plain LoRA (``peft_type`` LORA, optionally rsLoRA,
``rank_pattern``/``alpha_pattern``, ``layers_to_transform``) on the q/k/v/o/gate/up/down projections,
weights in ``adapter_model.safetensors``. Pickled weights are refused without being opened. Every
refusal is an ``AdapterValidationError`` whose message names the offending file, key or option.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import torch_threads
from ..errors import InvalidRequestError
from ..models.config import ModelConfig
from .patterns import MAX_PATTERNS, PatternError, compile_pattern, fullmatch, suffix_match

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_CONFIG_BYTES = 1 << 20

# PEFT (Hugging Face) module name -> (our fused projection, slice index within it, parent block)
SUPPORTED_MODULES = {
    "q_proj": ("qkv_proj", 0, "self_attn"),
    "k_proj": ("qkv_proj", 1, "self_attn"),
    "v_proj": ("qkv_proj", 2, "self_attn"),
    "o_proj": ("o_proj", 0, "self_attn"),
    "gate_proj": ("gate_up_proj", 0, "mlp"),
    "up_proj": ("gate_up_proj", 1, "mlp"),
    "down_proj": ("down_proj", 0, "mlp"),
}

_KEY_RE = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_(A|B)\.weight$")

# Options whose presence (truthy value) changes the forward pass in ways we do not implement.
_UNSUPPORTED_OPTIONS = {
    "use_dora": "DoRA (use_dora) is not supported",
    "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D-style weights) is not supported",
    "layer_replication": "layer_replication is not supported",
    "target_parameters": "target_parameters (LoRA on raw parameters) is not supported",
    "lora_bias": "lora_bias (a bias on lora_B) is not supported",
    "trainable_token_indices": "trainable_token_indices is not supported",
    "use_qalora": "QA-LoRA (use_qalora) is not supported",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens) is not supported",
    "megatron_config": "megatron_config is not supported",
    "use_bdlora": "use_bdlora is not supported",
    "arrow_config": "arrow_config is not supported",
}


class AdapterValidationError(InvalidRequestError):
    """The adapter directory cannot be served; the message says exactly why."""

    def __init__(self, message: str, param: str | None = "adapter"):
        super().__init__(message, param=param)


@dataclass(frozen=True)
class ModuleWeights:
    """One targeted module of one layer: ``lora_a`` [r, in], ``lora_b`` [out, r], ``scaling``."""

    layer: int
    module: str  # PEFT name: q_proj, ..., down_proj
    rank: int
    alpha: float
    scaling: float


@dataclass(frozen=True)
class AdapterInfo:
    path: str
    rank: int  # largest rank of any module (what a device slot must hold)
    alpha: float  # lora_alpha from the config
    target_modules: tuple[str, ...]  # PEFT module names that carry weights, sorted
    use_rslora: bool
    base_model_name_or_path: str | None
    peft_type: str = "LORA"
    config_rank: int = 0  # ``r`` from the config
    layers: tuple[int, ...] = ()  # layers that carry weights
    modules: tuple[ModuleWeights, ...] = ()
    num_parameters: int = 0
    size_bytes: int = 0
    sha256: str = ""  # of adapter_config.json + adapter_model.safetensors: the content version
    config: dict = field(default_factory=dict, repr=False)


def validate_adapter_dir(path: str | Path, base_model: str | Path | ModelConfig, max_lora_rank: int) -> AdapterInfo:
    """Validate ``path`` against ``base_model`` (a checkpoint directory or its ModelConfig), on a
    long-lived thread whatever thread calls it (``torch_threads``: servers call it from short-lived ones)."""
    info, _ = torch_threads.run(read_adapter, path, base_model, max_lora_rank)
    return info


def read_adapter(
    path: str | Path, base_model: str | Path | ModelConfig, max_lora_rank: int
) -> tuple[AdapterInfo, dict[str, torch.Tensor]]:
    """Validate and return the info plus the raw tensors keyed ``"{layer}.{module}.A|B"``.

    The weights file is read once: its bytes are hashed (the adapter's content version) and parsed
    by safetensors, which never executes code.
    """
    from safetensors.torch import load as load_safetensors

    mc = base_model if isinstance(base_model, ModelConfig) else _base_config(base_model)
    root = Path(path)
    if not root.is_dir():
        raise AdapterValidationError(f"adapter path {str(root)!r} is not a directory")
    pickles = sorted(p.name for p in root.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise AdapterValidationError(
            f"adapter directory contains pickled weights {pickles}: loraplex never unpickles files; "
            f"save the adapter as {WEIGHTS_FILE} (safe_serialization=True) and remove the pickle"
        )
    cfg_path, w_path = root / CONFIG_FILE, root / WEIGHTS_FILE
    if not cfg_path.is_file():
        raise AdapterValidationError(f"adapter directory has no {CONFIG_FILE}")
    if not w_path.is_file():
        raise AdapterValidationError(f"adapter directory has no {WEIGHTS_FILE}")
    cfg_bytes = cfg_path.read_bytes()
    if len(cfg_bytes) > MAX_CONFIG_BYTES:
        raise AdapterValidationError(f"{CONFIG_FILE} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        cfg = json.loads(cfg_bytes)
    except ValueError as exc:
        raise AdapterValidationError(f"{CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise AdapterValidationError(f"{CONFIG_FILE} must hold a JSON object")
    rank, alpha, use_rslora = _check_config(cfg, max_lora_rank)
    _check_base_architecture(cfg, mc)
    _check_target_modules(cfg.get("target_modules"), mc)

    w_bytes = w_path.read_bytes()
    try:
        tensors = load_safetensors(w_bytes)
    except Exception as exc:  # noqa: BLE001 - any parse failure means a bad file
        raise AdapterValidationError(f"{WEIGHTS_FILE} is not a readable safetensors file: {exc}") from None
    sha = hashlib.sha256(cfg_bytes)
    sha.update(b"\0")
    sha.update(w_bytes)

    weights, modules = _check_weights(tensors, cfg, mc, rank, alpha, use_rslora, max_lora_rank)
    info = AdapterInfo(
        path=str(root),
        rank=max(m.rank for m in modules),
        alpha=alpha,
        target_modules=tuple(sorted({m.module for m in modules})),
        use_rslora=use_rslora,
        base_model_name_or_path=cfg.get("base_model_name_or_path"),
        peft_type="LORA",
        config_rank=rank,
        layers=tuple(sorted({m.layer for m in modules})),
        modules=tuple(modules),
        num_parameters=sum(t.numel() for t in weights.values()),
        size_bytes=len(cfg_bytes) + len(w_bytes),
        sha256=sha.hexdigest(),
        config=cfg,
    )
    return info, weights


def _base_config(base_model: str | Path) -> ModelConfig:
    try:
        return ModelConfig.from_dir(base_model)
    except (OSError, ValueError, KeyError) as exc:
        raise AdapterValidationError(f"cannot read the base model config at {str(base_model)!r}: {exc}") from None


def _check_config(cfg: dict, max_lora_rank: int) -> tuple[int, float, bool]:
    peft_type = str(cfg.get("peft_type", "")).upper()
    if peft_type != "LORA":
        raise AdapterValidationError(
            f"unsupported PEFT type {cfg.get('peft_type')!r}: only LORA adapters can be served"
        )
    for option, message in _UNSUPPORTED_OPTIONS.items():
        if cfg.get(option):
            raise AdapterValidationError(f"{message} ({CONFIG_FILE}: {option}={cfg[option]!r})")
    bias = cfg.get("bias", "none")
    if bias not in (None, "none"):
        raise AdapterValidationError(
            f"bias={bias!r} is not supported (only bias='none'): trained biases are not served"
        )
    rank = cfg.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterValidationError(f"r must be a positive integer, got {rank!r}")
    if rank > max_lora_rank:
        raise AdapterValidationError(f"rank r={rank} exceeds this server's max_lora_rank={max_lora_rank}")
    alpha = cfg.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterValidationError(f"lora_alpha must be a finite number, got {alpha!r}")
    for name in ("rank_pattern", "alpha_pattern"):
        pattern = cfg.get(name) or {}
        if not isinstance(pattern, dict):
            raise AdapterValidationError(f"{name} must be an object, got {type(pattern).__name__}")
        if len(pattern) > MAX_PATTERNS:
            raise AdapterValidationError(f"{name} has {len(pattern)} keys, more than the limit of {MAX_PATTERNS}")
        for key, value in pattern.items():
            try:
                compile_pattern(rf"(.*\.)?({key})$")  # as it is matched (patterns.suffix_match)
            except PatternError as exc:
                raise AdapterValidationError(f"{name} key {key[:100]!r} is not a valid pattern: {exc}") from None
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise AdapterValidationError(f"{name}[{key!r}] must be a positive number, got {value!r}")
    return rank, float(alpha), bool(cfg.get("use_rslora", False))


def _check_base_architecture(cfg: dict, mc: ModelConfig) -> None:
    task = cfg.get("task_type")
    if task not in (None, "CAUSAL_LM"):
        raise AdapterValidationError(f"task_type {task!r} is not served: only CAUSAL_LM adapters are supported")
    # PEFT records the base model class when it knows it; the shape checks cover the rest.
    trained_for = (cfg.get("auto_mapping") or {}).get("base_model_class")
    if trained_for and trained_for != mc.architecture:
        raise AdapterValidationError(f"adapter was trained for {trained_for} but the base model is {mc.architecture}")


def _check_target_modules(targets: object, mc: ModelConfig) -> None:
    if targets is None:
        return  # PEFT's per-architecture defaults; the weights decide what is targeted
    if isinstance(targets, str):
        if targets == "all-linear":
            return
        try:
            compile_pattern(targets)
        except PatternError as exc:
            raise AdapterValidationError(f"target_modules {targets[:100]!r} is not a valid pattern: {exc}") from None
        # PEFT full-matches a string pattern against module names: test it on the base's modules.
        others = ["lm_head", "model.embed_tokens", "model.norm"]
        hits = [n for n in others if fullmatch(targets, n)]
        hits += [f"model.layers.0.{p}.{m}" for m, (_, _, p) in SUPPORTED_MODULES.items()]
        hits = [n for n in hits if fullmatch(targets, n) and n.rsplit(".", 1)[-1] not in SUPPORTED_MODULES]
        if hits:
            raise AdapterValidationError(
                f"target_modules pattern {targets[:100]!r} matches unsupported module(s) {hits}; "
                f"supported: {sorted(SUPPORTED_MODULES)}"
            )
        return
    if not isinstance(targets, (list, tuple)):
        raise AdapterValidationError(f"target_modules must be a list or a pattern, got {type(targets).__name__}")
    bad = sorted(str(t) for t in targets if str(t).rsplit(".", 1)[-1] not in SUPPORTED_MODULES)
    if bad:
        raise AdapterValidationError(
            f"unsupported target module(s) {bad}: loraplex serves LoRA on {sorted(SUPPORTED_MODULES)} only"
        )


def module_shapes(mc: ModelConfig) -> dict[str, tuple[int, int]]:
    """PEFT module name -> (in_features, out_features) of the base model's linear layer."""
    h, i = mc.hidden_size, mc.intermediate_size
    return {
        "q_proj": (h, mc.q_size),
        "k_proj": (h, mc.kv_size),
        "v_proj": (h, mc.kv_size),
        "o_proj": (mc.q_size, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def _pattern_value(pattern: dict[str, Any], module_path: str, default: float) -> Any:
    """``pattern``'s value (parsed JSON) for ``module_path``, else ``default``."""
    # Mirrors peft.utils.other.get_pattern_key: the first key that matches the end of the name.
    for key in pattern:
        if suffix_match(key, module_path):
            return pattern[key]
    return default


def _describe_unexpected(key: str) -> str:
    if "lora_magnitude_vector" in key:
        return f"tensor {key!r} is a DoRA magnitude vector: DoRA is not supported"
    if "lora_embedding_" in key or "embed_tokens" in key:
        return f"tensor {key!r} targets the token embedding: only q/k/v/o/gate/up/down projections are supported"
    if "lm_head" in key:
        return f"tensor {key!r} targets lm_head: only q/k/v/o/gate/up/down projections are supported"
    if re.search(r"lora_[AB]\.bias$", key):
        return f"tensor {key!r} is a LoRA bias: lora_bias is not supported"
    if ".lora_" in key:
        return f"tensor {key!r} targets an unsupported module: loraplex serves LoRA on {sorted(SUPPORTED_MODULES)} only"
    return f"unexpected tensor {key!r} (not a LoRA A/B weight of a supported projection)"


def _check_weights(
    tensors: dict[str, torch.Tensor],
    cfg: dict,
    mc: ModelConfig,
    rank: int,
    alpha: float,
    use_rslora: bool,
    max_lora_rank: int,
) -> tuple[dict[str, torch.Tensor], list[ModuleWeights]]:
    if not tensors:
        raise AdapterValidationError(f"{WEIGHTS_FILE} holds no tensors")
    shapes = module_shapes(mc)
    rank_pattern = cfg.get("rank_pattern") or {}
    alpha_pattern = cfg.get("alpha_pattern") or {}
    out: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        m = _KEY_RE.match(key)
        if m is None:
            raise AdapterValidationError(_describe_unexpected(key))
        layer, parent, module, ab = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if module not in SUPPORTED_MODULES:
            raise AdapterValidationError(_describe_unexpected(key))
        if SUPPORTED_MODULES[module][2] != parent:
            raise AdapterValidationError(f"tensor {key!r}: {module} does not belong under {parent}")
        if layer >= mc.num_layers:
            raise AdapterValidationError(
                f"tensor {key!r} targets layer {layer} but the base model has {mc.num_layers} layers"
            )
        if not t.is_floating_point() or t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise AdapterValidationError(f"tensor {key!r} has dtype {t.dtype}; expected float32/float16/bfloat16")
        if t.dim() != 2:
            raise AdapterValidationError(f"tensor {key!r} must be 2-D, got shape {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise AdapterValidationError(f"tensor {key!r} contains NaN or infinite values")
        out[f"{layer}.{module}.{ab}"] = t

    modules: list[ModuleWeights] = []
    for name in sorted(out):
        layer_s, module, ab = name.split(".")
        if ab != "A":
            if f"{layer_s}.{module}.A" not in out:
                raise AdapterValidationError(f"layer {layer_s} {module}: lora_B has no matching lora_A")
            continue
        b_name = f"{layer_s}.{module}.B"
        if b_name not in out:
            raise AdapterValidationError(f"layer {layer_s} {module}: lora_A has no matching lora_B")
        a, b = out[name], out[b_name]
        fan_in, fan_out = shapes[module]
        r = a.shape[0]
        parent = SUPPORTED_MODULES[module][2]
        module_path = f"model.layers.{layer_s}.{parent}.{module}"
        expected_r = int(_pattern_value(rank_pattern, module_path, rank))
        where = f"layer {layer_s} {module}"
        if tuple(a.shape) != (expected_r, fan_in):
            raise AdapterValidationError(
                f"{where}: lora_A shape {tuple(a.shape)} does not match the base model "
                f"(expected ({expected_r}, {fan_in}) for rank {expected_r} and in_features {fan_in})"
            )
        if tuple(b.shape) != (fan_out, expected_r):
            raise AdapterValidationError(
                f"{where}: lora_B shape {tuple(b.shape)} does not match the base model "
                f"(expected ({fan_out}, {expected_r}) for out_features {fan_out} and rank {expected_r})"
            )
        if r > max_lora_rank:
            raise AdapterValidationError(f"{where}: rank {r} exceeds this server's max_lora_rank={max_lora_rank}")
        m_alpha = float(_pattern_value(alpha_pattern, module_path, alpha))
        scaling = m_alpha / math.sqrt(r) if use_rslora else m_alpha / r
        modules.append(ModuleWeights(layer=int(layer_s), module=module, rank=r, alpha=m_alpha, scaling=scaling))
    if not modules:
        raise AdapterValidationError(f"{WEIGHTS_FILE} holds no LoRA weights")
    return out, modules
