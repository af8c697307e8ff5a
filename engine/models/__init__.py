"""Our own Llama-family decoder (Llama, Mistral, Qwen2) and its checkpoint loader."""

from .config import SUPPORTED_ARCHITECTURES, ModelConfig
from .llama import LlamaForCausalLM
from .loader import load_model

__all__ = ["LlamaForCausalLM", "ModelConfig", "SUPPORTED_ARCHITECTURES", "load_model"]
