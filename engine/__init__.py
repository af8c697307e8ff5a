"""loraplex.engine — continuous batching over a paged KV cache, multi-LoRA, tenant-aware scheduling.

Never imports loraplex.platform, FastAPI or SQLAlchemy: a tenant is only fields on a request.

The names below are the engine's public surface: the platform imports nothing else from the engine
(an import-linter contract in scripts/lint.sh holds it to that). They load lazily (PEP 562), so
``from loraplex.engine import EngineConfig`` in a CLI command does not import the model code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_EXPORTS = {
    "AsyncEngine": ".async_engine",
    "RequestStream": ".async_engine",
    "EngineConfig": ".config",
    "check_cpu_overrides": ".config",
    "ensure_demo_model": ".demo_model",
    "format_config": ".describe",
    "resolved_config": ".describe",
    "BusyError": ".errors",
    "EngineConfigError": ".errors",
    "EngineDeadError": ".errors",
    "EngineError": ".errors",
    "InvalidRequestError": ".errors",
    "UnknownAdapterError": ".errors",
    "LLM": ".llm",
    "LLMEngine": ".llm_engine",
    "auto_max_num_seqs": ".memory",
    "ModelConfig": ".models",
    "StructuredOutputManager": ".structured_output",
    "AdapterValidationError": ".lora",
    "validate_adapter_dir": ".lora",
    "CompletionOutput": ".outputs",
    "FinishReason": ".outputs",
    "OutputKind": ".outputs",
    "RequestOutput": ".outputs",
    "DEMO_MODEL_NAME": ".real_model",
    "DemoModelUnavailable": ".real_model",
    "ensure_demo_checkpoint": ".real_model",
    "EngineRequest": ".request",
    "FairGroup": ".request",
    "SamplingParams": ".sampling_params",
    "check_request_limits": ".sampling_params",
    "RequestLimits": ".config",
    "StructuredOutputSpec": ".sampling_params",
    "load_tokenizer": ".tokenizer",
}

if TYPE_CHECKING:
    from .async_engine import AsyncEngine, RequestStream
    from .config import EngineConfig, RequestLimits, check_cpu_overrides
    from .demo_model import ensure_demo_model
    from .describe import format_config, resolved_config
    from .errors import (
        BusyError,
        EngineConfigError,
        EngineDeadError,
        EngineError,
        InvalidRequestError,
        UnknownAdapterError,
    )
    from .llm import LLM
    from .llm_engine import LLMEngine
    from .lora import AdapterValidationError, validate_adapter_dir
    from .memory import auto_max_num_seqs
    from .models import ModelConfig
    from .outputs import CompletionOutput, FinishReason, OutputKind, RequestOutput
    from .real_model import DEMO_MODEL_NAME, DemoModelUnavailable, ensure_demo_checkpoint
    from .request import EngineRequest, FairGroup
    from .sampling_params import SamplingParams, StructuredOutputSpec, check_request_limits
    from .structured_output import StructuredOutputManager
    from .tokenizer import load_tokenizer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "DEMO_MODEL_NAME",
    "LLM",
    "AdapterValidationError",
    "AsyncEngine",
    "CompletionOutput",
    "BusyError",
    "DemoModelUnavailable",
    "EngineConfig",
    "EngineConfigError",
    "EngineDeadError",
    "EngineError",
    "EngineRequest",
    "FairGroup",
    "FinishReason",
    "InvalidRequestError",
    "LLMEngine",
    "ModelConfig",
    "OutputKind",
    "RequestLimits",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
    "StructuredOutputManager",
    "StructuredOutputSpec",
    "UnknownAdapterError",
    "auto_max_num_seqs",
    "check_cpu_overrides",
    "check_request_limits",
    "ensure_demo_checkpoint",
    "ensure_demo_model",
    "format_config",
    "load_tokenizer",
    "resolved_config",
    "validate_adapter_dir",
]
