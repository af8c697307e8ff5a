"""EngineConfig: every engine knob in one validated dataclass, built once and passed down.

The flat ``EngineConfig`` is what users set (``LLM(model, **engine_args)``, the server's ``[engine]``
TOML table, ``LORAPLEX_ENGINE__*``). The parts of the engine that need only a slice of it get a
typed view — ``SchedulerConfig``, ``CacheConfig``, ``LoRAConfig`` — so a scheduler test builds a
``SchedulerConfig`` without a model directory. Each view validates its own fields; ``EngineConfig``
validates by building them, so there is one rule per field and one place it is written.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Batching = Literal["continuous", "static"]
Policy = Literal["fcfs", "priority", "fair", "sjf"]
KernelBackend = Literal["auto", "torch", "cpu", "triton"]  # = loraplex.kernels.BACKENDS (a test checks)
BATCHING_MODES: tuple[str, ...] = get_args(Batching)
POLICIES: tuple[str, ...] = get_args(Policy)
KERNEL_BACKENDS: tuple[str, ...] = get_args(KernelBackend)
QUANTIZATION_METHODS: tuple[str | None, ...] = (None, "int8")
SPECULATIVE_METHODS: tuple[str | None, ...] = (None, "ngram", "draft")


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    batching: Batching = "continuous"
    scheduling_policy: Policy = "fair"
    max_loras: int = 8  # distinct adapters per step (= device slots)
    vtc_prompt_weight: float = 1.0
    vtc_output_weight: float = 2.0
    max_running_seqs_per_tenant: int | None = None
    max_kv_share_per_tenant: float | None = None
    lora_locality_slack: float = 0.0
    fair_share_preemption: bool = True
    priority_aging_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_loras"):
            _positive_int(name, getattr(self, name))
        _choice("batching", self.batching, BATCHING_MODES)
        _choice("scheduling_policy", self.scheduling_policy, POLICIES)
        if self.vtc_prompt_weight < 0 or self.vtc_output_weight < 0:
            raise ValueError("vtc_prompt_weight and vtc_output_weight must be >= 0")
        if self.max_kv_share_per_tenant is not None and not 0 < self.max_kv_share_per_tenant <= 1:
            raise ValueError(f"max_kv_share_per_tenant must be in (0, 1], got {self.max_kv_share_per_tenant!r}")
        if self.max_running_seqs_per_tenant is not None:
            _positive_int("max_running_seqs_per_tenant", self.max_running_seqs_per_tenant)
        if self.lora_locality_slack < 0 or self.priority_aging_s < 0:
            raise ValueError("lora_locality_slack and priority_aging_s must be >= 0 (0 disables)")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float = 1.0
    watermark: float = 0.01
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        _positive_int("block_size", self.block_size)
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 2):
            raise ValueError(f"num_kv_blocks must be an integer >= 2, got {self.num_kv_blocks!r}")
        if not self.kv_cache_memory_gb > 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb!r}")
        if not 0.0 <= self.watermark < 0.5:
            raise ValueError(f"watermark must be in [0, 0.5), got {self.watermark!r}")


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = 8
    max_cpu_loras: int = 32
    max_lora_rank: int = 64

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_cpu_loras", "max_lora_rank"):
            _positive_int(name, getattr(self, name))
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")


@dataclass(frozen=True)
class SpeculativeConfig:
    speculative_method: str | None = None
    num_speculative_tokens: int = 4
    speculative_adaptive: bool = True
    draft_model: str | None = None
    draft_kv_cache_memory_gb: float = 0.25
    draft_num_kv_blocks: int | None = None
    ngram_max_n: int = 4
    ngram_min_n: int = 1

    def __post_init__(self) -> None:
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_method must be one of {list(SPECULATIVE_METHODS)}, got {self.speculative_method!r}")
        n = self.num_speculative_tokens
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 16:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, 16], got {n!r}")
        if self.speculative_method == "draft" and not self.draft_model:
            raise ValueError("speculative_method='draft' needs draft_model (a local checkpoint directory)")
        _positive_int("ngram_min_n", self.ngram_min_n)
        _positive_int("ngram_max_n", self.ngram_max_n)
        if self.ngram_min_n > self.ngram_max_n:
            raise ValueError(f"ngram_min_n ({self.ngram_min_n}) must be <= ngram_max_n ({self.ngram_max_n})")
        if not self.draft_kv_cache_memory_gb > 0:
            raise ValueError(f"draft_kv_cache_memory_gb must be > 0, got {self.draft_kv_cache_memory_gb!r}")
        if self.draft_num_kv_blocks is not None and (
                not isinstance(self.draft_num_kv_blocks, int) or self.draft_num_kv_blocks < 2):
            raise ValueError(f"draft_num_kv_blocks must be an integer >= 2, got {self.draft_num_kv_blocks!r}")


_VIEWS: tuple[type, ...] = (SchedulerConfig, CacheConfig, LoRAConfig, SpeculativeConfig)
_V = TypeVar("_V", SchedulerConfig, CacheConfig, LoRAConfig, SpeculativeConfig)


@dataclass
class EngineConfig:
    model: str
    dtype: str = "auto"  # auto: the checkpoint's dtype on CUDA, float32 on CPU
    device: str = "auto"  # auto: cuda if available, else cpu
    max_model_len: int | None = None  # default: the model's max_position_embeddings (capped at 8192)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_kv_blocks: int | None = None  # default: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    watermark: float = 0.01  # fraction of KV blocks kept free when admitting new sequences
    batching: Batching = "continuous"
    kernel_backend: KernelBackend = "auto"  # auto | torch | cpu | triton (see loraplex.kernels.dispatch)
    scheduling_policy: Policy = "fair"
    enable_prefix_caching: bool = False
    # "int8": per-output-channel int8 weights for every linear layer, the head and the embedding,
    # quantized at load (LoRA and activations stay in `dtype`). None: weights in `dtype`.
    quantization: str | None = None
    # Speculative decoding (docs/speculative.md): "ngram" (prompt lookup) or "draft" (draft_model,
    # a smaller checkpoint with the same tokenizer, with its own small paged KV cache).
    speculative_method: str | None = None
    num_speculative_tokens: int = 4  # k: proposals verified per sequence per step (the maximum, if adaptive)
    speculative_adaptive: bool = True  # per-sequence k from its acceptance rate; off when it stays low
    draft_model: str | None = None
    draft_kv_cache_memory_gb: float = 0.25
    draft_num_kv_blocks: int | None = None
    ngram_max_n: int = 4
    ngram_min_n: int = 1
    # multi-LoRA
    max_loras: int = 8  # distinct adapters resident on the device (and per step)
    max_cpu_loras: int = 32  # adapters kept in host memory (LRU)
    max_lora_rank: int = 64
    # tenant-aware scheduling
    vtc_prompt_weight: float = 1.0
    vtc_output_weight: float = 2.0
    max_running_seqs_per_tenant: int | None = None
    max_kv_share_per_tenant: float | None = None  # fraction of KV blocks one tenant may hold
    lora_locality_slack: float = 0.0  # VTC counter slack within which resident adapters are preferred
    # fair: a tenant below its weighted share of batch slots may preempt the newest sequence of a
    # tenant above its share. Light tenants then get a slot at once (TTFT), at the price of some
    # recomputation (measured: 3-7% lower throughput than without it under a two-tenant overload).
    fair_share_preemption: bool = True
    priority_aging_s: float = 30.0  # a waiting request gains one priority class per this many seconds
    seed: int = 0
    tokenizer: str | None = None  # default: the model directory

    def __post_init__(self) -> None:
        path = Path(self.model)
        if not (path / "config.json").is_file():
            raise ValueError(f"model must be a local checkpoint directory with config.json, got {self.model!r}")
        self.validate_fields()
        if self.speculative_method == "draft" and not (Path(str(self.draft_model)) / "config.json").is_file():
            raise ValueError(f"draft_model must be a local checkpoint directory with config.json, got {self.draft_model!r}")

    def validate_fields(self) -> None:
        """Every check that does not need the model directory (the platform runs it at settings load)."""
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be one of {list(QUANTIZATION_METHODS)}, got {self.quantization!r}")
        _choice("kernel_backend", self.kernel_backend, KERNEL_BACKENDS)
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        for view in _VIEWS:  # builds (and so validates) every view
            self._view(view)

    def _view(self, cls: type[_V]) -> _V:
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self._view(SchedulerConfig)

    @property
    def cache_config(self) -> CacheConfig:
        return self._view(CacheConfig)

    @property
    def lora_config(self) -> LoRAConfig:
        return self._view(LoRAConfig)

    @property
    def speculative_config(self) -> SpeculativeConfig:
        return self._view(SpeculativeConfig)

    @classmethod
    def field_defaults(cls) -> dict[str, Any]:
        """name -> default for every field but ``model`` (for settings generated from this class)."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name != "model"}

    @classmethod
    def check(cls, **fields: Any) -> None:
        """Validate field values without a model directory; unknown names raise ``TypeError``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise TypeError(f"unknown engine setting(s): {', '.join(unknown)}")
        probe = cls.__new__(cls)
        for name, default in cls.field_defaults().items():
            setattr(probe, name, fields.get(name, default))
        probe.model = fields.get("model", "")
        probe.validate_fields()

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        if self.torch_device.type == "cpu" or checkpoint_dtype is None:
            return torch.float32
        return checkpoint_dtype
