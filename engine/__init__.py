"""loraplex.engine — continuous batching over a paged KV cache, multi-LoRA, tenant-aware scheduling.

Never imports loraplex.platform, FastAPI or SQLAlchemy: a tenant is only fields on a request.
"""

from .async_engine import AsyncEngine, RequestStream
from .config import EngineConfig
from .errors import EngineDeadError, EngineError, InvalidRequestError, UnknownAdapterError
from .llm import LLM
from .llm_engine import LLMEngine
from .outputs import CompletionOutput, FinishReason, OutputKind, RequestOutput
from .request import EngineRequest
from .sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncEngine",
    "CompletionOutput",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineRequest",
    "FinishReason",
    "OutputKind",
    "InvalidRequestError",
    "LLMEngine",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
    "UnknownAdapterError",
]
