"""Multi-LoRA serving: validate PEFT adapters, load them, keep them in CPU/device tiers by slot.

from loraplex.engine.lora import validate_adapter_dir, AdapterValidationError, LoRAManager
"""

from .manager import LoRAManager
from .registry import AdapterNotFoundError
from .validate import AdapterInfo, AdapterValidationError, ModuleWeights, validate_adapter_dir

__all__ = [
    "AdapterInfo",
    "AdapterNotFoundError",
    "AdapterValidationError",
    "LoRAManager",
    "ModuleWeights",
    "validate_adapter_dir",
]
