"""EngineConfig: every engine knob in one validated dataclass, built once and passed down."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BATCHING_MODES = ("continuous", "static")
POLICIES = ("fcfs", "priority", "fair", "sjf")


@dataclass
class EngineConfig:
    model: str
    dtype: str = "auto"  # auto: see resolve_dtype (checkpoint dtype on CUDA, bf16 on a bf16-capable CPU)
    device: str = "auto"  # auto: cuda if available, else cpu
    max_model_len: int | None = None  # default: the model's max_position_embeddings (capped at 8192)
    max_num_seqs: int | None = None  # None: sized from the device and the KV memory (engine/memory.py)
    max_num_batched_tokens: int = 512
    block_size: int = 16
    num_kv_blocks: int | None = None  # default: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float | None = None  # None: sized from the device's free memory
    watermark: float = 0.01  # fraction of KV blocks kept free when admitting new sequences
    batching: str = "continuous"
    kernel_backend: str = "auto"  # auto | torch | triton
    scheduling_policy: str = "fair"
    # On by default: with no hits it costs a hash per full block (benchmarks/prefix_cache.py measures it).
    enable_prefix_caching: bool = True
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
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        path = Path(self.model)
        if not (path / "config.json").is_file():
            raise ValueError(f"model must be a local checkpoint directory with config.json, got {self.model!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")
        if self.kernel_backend not in ("auto", "torch", "triton"):
            raise ValueError(f"kernel_backend must be auto, torch or triton, got {self.kernel_backend!r}")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {POLICIES}, got {self.scheduling_policy!r}")
        if self.max_num_seqs is None or (self.kv_cache_memory_gb is None and self.num_kv_blocks is None):
            self._size_from_memory()
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_loras", "max_cpu_loras", "max_lora_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2, got {self.num_kv_blocks}")
        if not 0.0 <= self.watermark < 0.5:
            raise ValueError(f"watermark must be in [0, 0.5), got {self.watermark}")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be >= max_loras")
        if self.vtc_prompt_weight < 0 or self.vtc_output_weight < 0:
            raise ValueError("vtc weights must be >= 0")
        if self.max_kv_share_per_tenant is not None and not 0 < self.max_kv_share_per_tenant <= 1:
            raise ValueError("max_kv_share_per_tenant must be in (0, 1]")
        if self.max_running_seqs_per_tenant is not None and (
                not isinstance(self.max_running_seqs_per_tenant, int) or self.max_running_seqs_per_tenant < 1):
            raise ValueError("max_running_seqs_per_tenant must be a positive integer or None")
        if self.lora_locality_slack < 0 or self.priority_aging_s < 0:
            raise ValueError("lora_locality_slack and priority_aging_s must be >= 0 (0 disables)")

    def _size_from_memory(self) -> None:
        """Fill the unset KV memory (unless num_kv_blocks fixes the pool) and batch size."""
        from .memory import auto_kv_cache_gb, auto_max_num_seqs, kv_bytes_per_token
        from .models import ModelConfig

        mc = ModelConfig.from_dir(self.model)
        device = self.torch_device
        dtype = self.torch_dtype(mc.checkpoint_dtype)
        if self.kv_cache_memory_gb is None and self.num_kv_blocks is None:
            self.kv_cache_memory_gb = auto_kv_cache_gb(device, Path(self.model), mc, dtype)
        if self.max_num_seqs is None:
            # A pool fixed by num_kv_blocks is the caller's choice: only the device caps the batch.
            kv_tokens = None if self.num_kv_blocks is not None else (
                int((self.kv_cache_memory_gb or 0) * (1 << 30)) // kv_bytes_per_token(mc, dtype))
            self.max_num_seqs = auto_max_num_seqs(device, kv_tokens)

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        return resolve_dtype(self.dtype, self.torch_device, checkpoint_dtype)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), where bf16 beats fp32.

    Without it, torch emulates bf16 matmuls through fp32 and bf16 is slower than fp32."""
    flags = _cpu_flags()
    if flags:
        return bool(flags & {"avx512_bf16", "amx_bf16"})
    # No /proc/cpuinfo (macOS, Windows): torch's own detection, which only sees AMX.
    capability = torch.backends.cpu.get_cpu_capability()
    return "AMX" in capability.upper()


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def resolve_dtype(dtype: str, device: torch.device, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
    """What ``dtype`` means on ``device``: an explicit name is taken as is; ``auto`` is the
    checkpoint's dtype on CUDA (a bf16 checkpoint runs in float16 on a GPU without bf16), bfloat16
    on a CPU with native bf16 whatever the checkpoint (half the memory traffic of float32), and
    float32 on any other CPU."""
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
        return _DTYPES[dtype]
    if device.type == "cuda":
        if checkpoint_dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            return torch.float16
        return checkpoint_dtype or torch.float32
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
