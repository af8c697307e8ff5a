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

from loraplex.kernels import check_group_size

from .errors import EngineConfigError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Batching = Literal["continuous", "static"]
Policy = Literal["fcfs", "priority", "fair", "sjf"]
KernelBackend = Literal["auto", "torch", "cpu", "triton"]  # = loraplex.kernels.BACKENDS (a test checks)
LoraDtype = Literal["auto", "model", "float16", "bfloat16", "float32"]
BATCHING_MODES: tuple[str, ...] = get_args(Batching)
POLICIES: tuple[str, ...] = get_args(Policy)
KERNEL_BACKENDS: tuple[str, ...] = get_args(KernelBackend)
LORA_DTYPES: tuple[str, ...] = get_args(LoraDtype)
QUANTIZATION_METHODS: tuple[str | None, ...] = (None, "int8", "int4", "w8a8")
SPECULATIVE_METHODS: tuple[str | None, ...] = (None, "ngram", "draft")


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _non_negative_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_prefill_tokens_with_decodes: int | None = 128
    prefill_group_tokens: int = 0
    prefill_tokens_per_decode: int = 0
    batching: Batching = "continuous"
    scheduling_policy: Policy = "fair"
    max_loras: int = 8  # distinct adapters per step (= device slots)
    vtc_prompt_weight: float = 1.0
    vtc_output_weight: float = 2.0
    max_running_seqs_per_tenant: int | None = None
    max_kv_share_per_tenant: float | None = None
    lora_locality_slack: float = 0.0
    fair_share_preemption: bool = True
    preemption_min_run_steps: int = 4
    priority_aging_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_loras"):
            _positive_int(name, getattr(self, name))
        if self.max_prefill_tokens_with_decodes is not None:
            _positive_int("max_prefill_tokens_with_decodes", self.max_prefill_tokens_with_decodes)
        _non_negative_int("prefill_group_tokens", self.prefill_group_tokens)
        _non_negative_int("prefill_tokens_per_decode", self.prefill_tokens_per_decode)
        _choice("batching", self.batching, BATCHING_MODES)
        _choice("scheduling_policy", self.scheduling_policy, POLICIES)
        if self.vtc_prompt_weight < 0 or self.vtc_output_weight < 0:
            raise ValueError("vtc_prompt_weight and vtc_output_weight must be >= 0")
        if self.max_kv_share_per_tenant is not None and not 0 < self.max_kv_share_per_tenant <= 1:
            raise ValueError(f"max_kv_share_per_tenant must be in (0, 1], got {self.max_kv_share_per_tenant!r}")
        if self.max_running_seqs_per_tenant is not None:
            _positive_int("max_running_seqs_per_tenant", self.max_running_seqs_per_tenant)
        if not isinstance(self.preemption_min_run_steps, int) or self.preemption_min_run_steps < 0:
            raise ValueError(f"preemption_min_run_steps must be an integer >= 0, got {self.preemption_min_run_steps!r}")
        if self.lora_locality_slack < 0 or self.priority_aging_s < 0:
            raise ValueError("lora_locality_slack and priority_aging_s must be >= 0 (0 disables)")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_kv_blocks: int | None = None  # fixes the pool; else sized from kv_cache_memory_gb
    kv_cache_memory_gb: float | None = 1.0
    watermark: float = 0.01
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _positive_int("block_size", self.block_size)
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 2):
            raise ValueError(f"num_kv_blocks must be an integer >= 2, got {self.num_kv_blocks!r}")
        if self.num_kv_blocks is None and self.kv_cache_memory_gb is None:
            raise ValueError("set kv_cache_memory_gb or num_kv_blocks")
        if self.kv_cache_memory_gb is not None and not self.kv_cache_memory_gb > 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb!r}")
        if not 0.0 <= self.watermark < 0.5:
            raise ValueError(f"watermark must be in [0, 0.5), got {self.watermark!r}")


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = 8
    max_cpu_loras: int = 32
    max_lora_rank: int = 64
    lora_dtype: LoraDtype = "auto"

    def __post_init__(self) -> None:
        _choice("lora_dtype", self.lora_dtype, LORA_DTYPES)
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
    draft_num_layers: int | None = None
    ngram_max_n: int = 4
    ngram_min_n: int = 1

    def __post_init__(self) -> None:
        if self.draft_num_layers is not None:
            _positive_int("draft_num_layers", self.draft_num_layers)
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_method must be one of {list(SPECULATIVE_METHODS)}, got {self.speculative_method!r}"
            )
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
            not isinstance(self.draft_num_kv_blocks, int) or self.draft_num_kv_blocks < 2
        ):
            raise ValueError(f"draft_num_kv_blocks must be an integer >= 2, got {self.draft_num_kv_blocks!r}")


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of the engine thread (docs/security.md, "Attacker-controlled
    sizes"). Every stop string is checked against every generated token of every sample, every
    logit_bias entry is applied at every step, and a grammar costs CPU to compile: each is bounded
    here, and a request over a bound is refused with a 400 naming the field."""

    # OpenAI allows 4 stop sequences; vLLM has no limit. 16 strings / 1,024 characters in all keeps
    # the per-token check a few short windowed searches (engine/detokenizer.py).
    max_stop_strings: int = 16
    max_stop_chars: int = 1024
    # vLLM's bad_words (no OpenAI counterpart): each word is tokenized in two forms and every form's
    # last token may be masked at every step. Counted in words and in characters of all words (the
    # platform checks both before tokenizing); the engine, which sees token ids, allows two forms
    # per word. The sampler looks the forms up by their next-to-last token, not one by one.
    max_bad_words: int = 256
    max_bad_words_chars: int = 4096
    # OpenAI documents values in [-100, 100] and refuses more than 300 entries.
    max_logit_bias: int = 300
    # A JSON schema / regex / grammar larger than this is refused before compiling (compile time
    # grows faster than the size: ~0.1 s at 40 KB, ~5 s at 165 KB on a loaded 2-core EPYC).
    max_structured_spec_bytes: int = 128 * 1024
    # Grammar compilation (off the engine thread, in the structured-output manager's pool): at most
    # this many compilations of one tenant at once; a request waits at most the timeout for its
    # grammar (the compilation itself goes on and keeps its tenant's slot until it ends).
    structured_compile_per_tenant: int = 1
    structured_compile_timeout_s: float = 20.0
    # Compile time is charged to the tenant's fair-share (VTC) counter as this many output tokens
    # per second of compilation: a tenant that makes the server compile waits for it like one that
    # made it generate.
    structured_compile_tokens_per_s: float = 1000.0

    def __post_init__(self) -> None:
        for name in (
            "max_stop_strings",
            "max_stop_chars",
            "max_bad_words",
            "max_bad_words_chars",
            "max_logit_bias",
            "max_structured_spec_bytes",
            "structured_compile_per_tenant",
        ):
            _positive_int(name, getattr(self, name))
        for name in ("structured_compile_timeout_s",):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"{name} must be > 0, got {v!r}")
        v = self.structured_compile_tokens_per_s
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
            raise ValueError(f"structured_compile_tokens_per_s must be >= 0, got {v!r}")


def check_cpu_overrides() -> None:
    """The CPU kernels' environment overrides (``LORAPLEX_CPU_KIND``, ``LORAPLEX_BF16_LINEAR``),
    checked before anything reads them: a typo is one ``EngineConfigError`` naming the variable, not
    a traceback from load. ``EngineConfig`` calls it; a launcher whose engines start elsewhere (Ray
    replicas) calls it first, in its own process."""
    from loraplex.kernels import cpu_packed

    try:
        cpu_packed.check_environment()
    except cpu_packed.CpuSettingError as exc:
        raise EngineConfigError(str(exc)) from None


# Fields that may be None (auto-sized from the device once the model is known) and a valid stand-in
# to check the others with before that.
_AUTO_PLACEHOLDER: dict[str, Any] = {"max_num_seqs": 1, "kv_cache_memory_gb": 1.0, "prefill_group_tokens": 0}
_VIEWS: tuple[type, ...] = (SchedulerConfig, CacheConfig, LoRAConfig, SpeculativeConfig, RequestLimits)
_V = TypeVar("_V", SchedulerConfig, CacheConfig, LoRAConfig, SpeculativeConfig, RequestLimits)


@dataclass
class EngineConfig:
    model: str
    dtype: str = "auto"  # auto: see resolve_dtype (checkpoint dtype on CUDA, bf16 on a bf16-capable CPU)
    device: str = "auto"  # auto: cuda if available, else cpu
    max_model_len: int | None = None  # default: the model's max_position_embeddings (capped at 8192)
    max_num_seqs: int | None = None  # None: sized from the device and the KV memory (engine/memory.py)
    # A step with no decodes takes a whole burst of prompts at once (16 x 128 tokens: one step,
    # before anyone streams); while sequences decode, each prompt adds at most
    # max_prefill_tokens_with_decodes tokens to a step (a new admission or a continuing prefill):
    # a long prefill chunk makes that step several times slower and every running stream's next
    # token waits for it. Per prompt, not per step: prompts that arrive together still join one
    # step (up to max_num_batched_tokens), so a burst stalls the streams once, not once per prompt
    # (that kept arrivals staggered and put ITL p99 on those steps: docs/cpu-performance.md).
    # None: only max_num_batched_tokens bounds them.
    max_num_batched_tokens: int = 2048
    max_prefill_tokens_with_decodes: int | None = 128
    # A burst prefilled in one step gives every prompt its first token at the end of the whole burst
    # (TTFT p50 = the burst's time). With N > 0, waiting prompts stop joining a step once it carries
    # N prompt tokens: the burst goes a group at a time and the first groups stream early. A prompt is
    # never cut for this (the first one admitted may exceed N), so a long prompt alone keeps its
    # one-step prefill. 0: off (a step fills up to max_num_batched_tokens). None: sized at start from
    # the CPU kind, the smallest step whose prefill runs at its full rate there
    # (kernels/cpu_packed.PREFILL_GROUP_TOKENS, measured by benchmarks/engine/prefill_group.py);
    # 0 on CUDA, for float32 models and on the torch backend (not measured there).
    prefill_group_tokens: int | None = None
    # While N sequences decode and W wait, a step adds at most (N + W) x prefill_tokens_per_decode
    # prompt tokens (scheduler.prompt_room; a chunk is cut to fit), so the streams' next token waits
    # for less prompt work. 0 (default): off. Measured over HTTP (docs/cpu-performance.md, "...the
    # prompt room"): 4 halves ITL p99 at 16 clients for ~15% of that row's throughput, same at 64.
    prefill_tokens_per_decode: int = 0
    block_size: int = 16
    num_kv_blocks: int | None = None  # default: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float | None = None  # None: sized from the device's free memory
    watermark: float = 0.01  # fraction of KV blocks kept free when admitting new sequences
    batching: Batching = "continuous"
    kernel_backend: KernelBackend = "auto"  # auto | torch | cpu | triton (see loraplex.kernels.dispatch)
    # Every row computed as if it were alone (fixed-shape GEMM tiles, per-row attention): a seeded
    # request then gives the same tokens whatever shares its batch. Costs throughput
    # (benchmarks/engine/batch_invariance.py); needs the native CPU kernels; no speculative decoding.
    batch_invariant: bool = False
    scheduling_policy: Policy = "fair"
    # On by default: with no hits it costs a hash per full block (benchmarks/engine/prefix_cache.py measures it).
    enable_prefix_caching: bool = True
    # "int8": per-output-channel int8 weights for every linear layer, the head and the embedding,
    # quantized at load (LoRA and activations stay in `dtype`). "int4": group-wise asymmetric 4-bit
    # weights for every decoder linear layer (head and embedding int8), quantized at load. "w8a8":
    # int8's weights, and the decoder linears' activations quantized to int8 per token at each call
    # (int8 x int8 -> int32 matmul), the head's too (embedding: int8 rows; LoRA in `dtype`). None:
    # weights in `dtype`, or a GPTQ/AWQ 4-bit checkpoint's own codes (its config.json says so).
    quantization: str | None = None
    # Columns per int4 scale/zero point: a multiple of 32 (32, 64, 128, 256); smaller groups track
    # the weights more closely at 8 bytes per group (~6% of the codes' bytes at 128).
    quantization_group_size: int = 128
    # Speculative decoding (docs/speculative.md): "ngram" (prompt lookup) or "draft" (draft_model,
    # a smaller checkpoint with the same tokenizer, with its own small paged KV cache).
    speculative_method: str | None = None
    num_speculative_tokens: int = 4  # k: proposals verified per sequence per step (the maximum, if adaptive)
    speculative_adaptive: bool = True  # per-sequence k from its acceptance rate; off when it stays low
    draft_model: str | None = None
    draft_kv_cache_memory_gb: float = 0.25
    draft_num_kv_blocks: int | None = None
    # Run only the draft's first N layers (then its norm and head). With draft_model = the target's
    # own directory this is self-speculation: the draft shares the target's weights and LoRA slots.
    draft_num_layers: int | None = None
    ngram_max_n: int = 4
    ngram_min_n: int = 1
    # multi-LoRA
    max_loras: int = 8  # distinct adapters resident on the device (and per step)
    max_cpu_loras: int = 32  # adapters kept in host memory (LRU)
    max_lora_rank: int = 64
    # Storage dtype of adapter A/B weights (host cache and slots); math stays in fp32 either way.
    # "auto": float16 beside a float32 model on the native CPU kernels when they convert float16 in
    # vector registers (AVX-512): half the bytes a decode step over many adapters streams, measured
    # faster (docs/cpu-performance.md); otherwise the model dtype. "model": always the model dtype
    # (bit-exact with the unquantised adapter). float16 / bfloat16 / float32: that dtype.
    lora_dtype: LoraDtype = "auto"
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
    # A running sequence younger than this many steps (since it started or restarted) is never
    # pushed out for a waiting request, and one waiting request preempts per step at most: the
    # hysteresis that keeps admission preemptions (classes, fair share) from thrashing.
    preemption_min_run_steps: int = 4
    priority_aging_s: float = 30.0  # a waiting request gains one priority class per this many seconds
    seed: int = 0
    tokenizer: str | None = None  # default: the model directory
    # per-request bounds on engine-thread work (RequestLimits says why each exists)
    max_stop_strings: int = 16
    max_stop_chars: int = 1024
    max_bad_words: int = 256
    max_bad_words_chars: int = 4096
    max_logit_bias: int = 300
    max_structured_spec_bytes: int = 128 * 1024
    structured_compile_per_tenant: int = 1
    structured_compile_timeout_s: float = 20.0
    structured_compile_tokens_per_s: float = 1000.0

    def __post_init__(self) -> None:
        path = Path(self.model)
        if not (path / "config.json").is_file():
            raise ValueError(f"model must be a local checkpoint directory with config.json, got {self.model!r}")
        self.validate_fields(sizes_may_be_auto=True)  # before sizing reads dtype and device
        check_cpu_overrides()
        if self.max_num_seqs is None or (self.kv_cache_memory_gb is None and self.num_kv_blocks is None):
            self._size_from_memory()
        if self.prefill_group_tokens is None:
            self.prefill_group_tokens = self._auto_prefill_group_tokens()
        self.validate_fields()
        if self.speculative_method == "draft" and not (Path(str(self.draft_model)) / "config.json").is_file():
            raise ValueError(
                f"draft_model must be a local checkpoint directory with config.json, got {self.draft_model!r}"
            )

    def validate_fields(self, sizes_may_be_auto: bool = False) -> None:
        """Every check that does not need the model directory (the platform runs it at settings load,
        where ``max_num_seqs`` / ``kv_cache_memory_gb`` may still be None = sized at start)."""
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be one of {list(QUANTIZATION_METHODS)}, got {self.quantization!r}")
        try:
            check_group_size(self.quantization_group_size)
        except ValueError as exc:
            raise ValueError(f"quantization_group_size: {exc}") from None
        _choice("kernel_backend", self.kernel_backend, KERNEL_BACKENDS)
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be true or false, got {self.batch_invariant!r}")
        if self.batch_invariant and self.speculative_method is not None:
            # How many drafts a row verifies depends on the KV room the rest of the batch leaves,
            # and a sampled row's draws with it.
            raise ValueError("batch_invariant cannot be combined with speculative_method")
        if self.max_model_len is not None:
            _positive_int("max_model_len", self.max_model_len)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.kv_cache_memory_gb is not None and not self.kv_cache_memory_gb > 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb!r}")
        for view in _VIEWS:  # builds (and so validates) every view
            self._view(view, sizes_may_be_auto=sizes_may_be_auto)

    def _view(self, cls: type[_V], sizes_may_be_auto: bool = False) -> _V:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(cls)}
        if sizes_may_be_auto:  # None = sized from the device at construction: validate the rest
            values.update({k: _AUTO_PLACEHOLDER[k] for k in _AUTO_PLACEHOLDER if k in values and values[k] is None})
        return cls(**values)

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

    @property
    def request_limits(self) -> RequestLimits:
        return self._view(RequestLimits)

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
        probe.validate_fields(sizes_may_be_auto=True)

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
            kv_tokens = (
                None
                if self.num_kv_blocks is not None
                else (int((self.kv_cache_memory_gb or 0) * (1 << 30)) // kv_bytes_per_token(mc, dtype))
            )
            self.max_num_seqs = auto_max_num_seqs(device, kv_tokens)

    def _auto_prefill_group_tokens(self) -> int:
        from loraplex.kernels import cpu_packed

        from .models import ModelConfig

        device = self.torch_device
        if device.type != "cpu" or self.kernel_backend == "torch":
            return 0
        return cpu_packed.prefill_group_tokens(self.torch_dtype(ModelConfig.from_dir(self.model).checkpoint_dtype))

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
