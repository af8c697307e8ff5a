"""The one seam between the platform and ``loraplex.engine``: nothing else in platform imports it.

``EngineGateway`` owns the running ``AsyncEngine`` (or none, when the engine is disabled) and
exposes only what the control plane needs: tenant scheduling fields, adapter registration and
validation, live stats, tokenizer and generation.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.platform.errors import ServiceUnavailable, Unprocessable
from loraplex.platform.settings import Settings

log = logging.getLogger("loraplex.platform.engine")


@dataclass(frozen=True)
class AdapterFacts:
    rank: int
    alpha: float
    target_modules: list[str]
    use_rslora: bool
    base_model: str


class AdapterInvalid(Unprocessable):
    code = "invalid_adapter"


TINY_RANDOM_MODEL = "tiny-random"


def demo_model_dir(settings: Settings) -> Path:
    """Where the embedded SmolLM2 checkpoint lives once converted (inside the data directory)."""
    from loraplex.engine.real_model import DEMO_MODEL_NAME

    return settings.data_dir / "models" / DEMO_MODEL_NAME


def resolve_model_dir(settings: Settings) -> Path:
    """The configured base model; empty = SmolLM2-135M-Instruct converted once into the data
    directory; ``tiny-random`` = the random-weight demo model (tiny shapes, no package needed)."""
    if settings.engine.model == TINY_RANDOM_MODEL:
        from loraplex.engine.demo_model import ensure_demo_model

        return Path(ensure_demo_model(settings.data_dir / "demo-model"))
    if settings.engine.model:
        path = Path(settings.engine.model).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"engine.model {path} is not a directory")
        return path
    from loraplex.engine.real_model import ensure_demo_checkpoint

    return ensure_demo_checkpoint(demo_model_dir(settings))


class EngineGateway:
    def __init__(self, engine: Any | None, model_dir: Path | None, max_lora_rank: int) -> None:
        self._engine = engine
        self.model_dir = model_dir
        self.max_lora_rank = max_lora_rank
        self._lock = threading.Lock()
        self._adapters: dict[str, str] = {}  # engine key -> path, for stats and idempotence

    @classmethod
    def disabled(cls) -> "EngineGateway":
        return cls(None, None, 0)

    @classmethod
    def validator_only(cls, settings: Settings) -> "EngineGateway":
        """No running engine, but adapters can be validated against the base model (CLI)."""
        return cls(None, resolve_model_dir(settings), settings.engine.max_lora_rank)

    @classmethod
    def start(cls, settings: Settings) -> "EngineGateway":
        if not settings.engine.enabled:
            return cls.disabled()
        from loraplex.engine import AsyncEngine, EngineConfig

        model_dir = resolve_model_dir(settings)
        es = settings.engine
        config = EngineConfig(
            model=str(model_dir),
            dtype=es.dtype,
            max_num_seqs=es.max_num_seqs,
            max_loras=es.max_loras,
            max_lora_rank=es.max_lora_rank,
            kernel_backend=es.kernel_backend,
            **_device_kwargs(EngineConfig, es.device),
            **es.extra,
        )
        engine = AsyncEngine(config)
        engine.start()
        log.info("engine started on %s", model_dir)
        return cls(engine, model_dir, es.max_lora_rank)

    @property
    def enabled(self) -> bool:
        return self._engine is not None

    @property
    def model_name(self) -> str:
        return self.model_dir.name if self.model_dir else ""

    @property
    def engine(self) -> Any:
        if self._engine is None:
            raise ServiceUnavailable("the inference engine is disabled on this server")
        return self._engine

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def resolved_config(self) -> dict[str, Any]:
        """The engine configuration with every ``auto`` resolved (printed by ``serve``)."""
        from loraplex.engine.describe import resolved_config

        return resolved_config(self.engine.engine)

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    # -- tenants ---------------------------------------------------------------------------
    def set_tenant(
        self, tenant_id: str, priority: int, weight: float, max_running_seqs: int | None
    ) -> None:
        if self._engine is not None:
            # None clears the tenant's own cap (the engine-wide default applies again).
            self._engine.set_tenant(tenant_id, priority=priority, weight=weight, max_running_seqs=max_running_seqs)

    # -- adapters --------------------------------------------------------------------------
    def validate_adapter(self, path: Path) -> AdapterFacts:
        if self.model_dir is None:
            raise ServiceUnavailable(
                "adapters cannot be validated: the inference engine is disabled on this server"
            )
        from loraplex.engine.lora import AdapterValidationError, validate_adapter_dir

        try:
            info = validate_adapter_dir(str(path), str(self.model_dir), self.max_lora_rank)
        except AdapterValidationError as exc:
            raise AdapterInvalid(f"adapter refused: {exc}", param="file") from None
        return AdapterFacts(
            rank=int(info.rank),
            alpha=float(info.alpha),
            target_modules=sorted(info.target_modules),
            use_rslora=bool(info.use_rslora),
            base_model=str(info.base_model_name_or_path or ""),
        )

    def add_adapter(self, key: str, path: Path) -> None:
        with self._lock:
            if self._engine is not None and key not in self._adapters:
                try:
                    self._engine.add_adapter(key, str(path))
                except Exception as exc:  # e.g. an engine built without LoRA support
                    raise ServiceUnavailable(f"the engine could not load the adapter: {exc}") from exc
            self._adapters[key] = str(path)

    def remove_adapter(self, key: str) -> None:
        with self._lock:
            if self._adapters.pop(key, None) is not None and self._engine is not None:
                try:
                    self._engine.remove_adapter(key)
                except KeyError:
                    pass

    def registered_adapters(self) -> list[str]:
        with self._lock:
            return sorted(self._adapters)

    # -- live state and generation ---------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        if self._engine is None:
            return {"enabled": False}
        return {"enabled": True, "model": self.model_name, **self._engine.stats()}

    def submit(self, prompt_token_ids: list[int], params: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self.engine.submit(prompt_token_ids, params, **kwargs)

    def abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._engine.abort(request_id)

    def sampling_params(self, **kwargs: Any) -> Any:
        from loraplex.engine import SamplingParams

        return SamplingParams(**kwargs)


def _device_kwargs(config_cls: Any, device: str) -> dict[str, Any]:
    # Only pass `device` if this EngineConfig has such a field (the contract does not promise it).
    fields = getattr(config_cls, "__dataclass_fields__", None) or getattr(config_cls, "model_fields", {})
    return {"device": device} if "device" in fields else {}
