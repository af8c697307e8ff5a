"""The one seam between the platform and ``loraplex.engine``: nothing else in platform imports it.

``EngineGateway`` owns the running ``AsyncEngine`` (or none, when the engine is disabled) and
exposes only what the control plane needs: tenant scheduling fields, adapter registration and
validation, live stats, tokenizer and generation.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.platform.errors import BadRequest, NotFound, PlatformError, ServiceUnavailable, Unprocessable
from loraplex.platform.settings import Settings, engine_config_kwargs

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
        self._max_prompt_chars: int | None = None

    @classmethod
    def disabled(cls) -> EngineGateway:
        return cls(None, None, 0)

    @classmethod
    def validator_only(cls, settings: Settings) -> EngineGateway:
        """No running engine, but adapters can be validated against the base model (CLI)."""
        return cls(None, resolve_model_dir(settings), settings.engine.max_lora_rank)

    @classmethod
    def start(cls, settings: Settings) -> EngineGateway:
        if not settings.engine.enabled:
            return cls.disabled()
        from loraplex.engine import AsyncEngine, EngineConfig

        model_dir = resolve_model_dir(settings)
        config = EngineConfig(model=str(model_dir), **engine_config_kwargs(settings.engine))
        engine = AsyncEngine(config)
        engine.start()
        log.info("engine started on %s", model_dir)
        return cls(engine, model_dir, settings.engine.max_lora_rank)

    @property
    def enabled(self) -> bool:
        return self._engine is not None

    @property
    def replica_name(self) -> str:
        """Names this engine in ``x-loraplex-replica`` (one process: host and pid)."""
        return f"{socket.gethostname()}-{os.getpid()}"

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

    @property
    def alive(self) -> bool:
        """The engine loop is running and taking work (False when disabled, stopped or dead)."""
        return self._engine is not None and bool(getattr(self._engine, "is_running", True))

    def max_prompt_chars(self) -> int | None:
        """A prompt longer than this many characters cannot fit the context whatever it says:
        ``max_model_len`` tokens, each at most as long as the vocabulary's longest token (a
        byte-level token covers one byte, and a character is at least one byte). Checked before
        tokenizing, so a huge prompt costs nothing."""
        if self._max_prompt_chars is None and self._engine is not None:
            longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
            self._max_prompt_chars = int(self._engine.stats()["max_model_len"]) * max(longest, 1)
        return self._max_prompt_chars

    def resolved_config(self) -> dict[str, Any]:
        """The engine configuration with every ``auto`` resolved (printed by ``serve``)."""
        from loraplex.engine.describe import resolved_config

        return resolved_config(self.engine.engine)

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    # -- tenants ---------------------------------------------------------------------------
    def set_tenant(self, tenant_id: str, priority: int, weight: float, max_running_seqs: int | None) -> None:
        if self._engine is not None:
            # None clears the tenant's own cap (the engine-wide default applies again).
            try:
                self._engine.set_tenant(tenant_id, priority=priority, weight=weight, max_running_seqs=max_running_seqs)
            except Exception as exc:
                raise _platform_error(exc) from None

    # -- adapters --------------------------------------------------------------------------
    def validate_adapter(self, path: Path) -> AdapterFacts:
        if self.model_dir is None:
            raise ServiceUnavailable("adapters cannot be validated: the inference engine is disabled on this server")
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
        try:
            return {"enabled": True, "model": self.model_name, **self._engine.stats()}
        except Exception as exc:
            raise _platform_error(exc) from None

    def submit(
        self,
        prompt_token_ids: list[int],
        params: Any,
        *,
        request_id: str,
        adapter: str | None,
        tenant_id: str,
        cache_salt: str | None,
    ) -> AsyncIterator[Any]:
        """Queue a generation; yields the engine's DELTA outputs. Every engine error comes out as a
        platform error (a bad request is a 4xx, a dead engine a 503), at submit or while iterating."""
        from loraplex.engine import EngineRequest, OutputKind

        request = EngineRequest(
            prompt_token_ids,
            params,
            request_id=request_id,
            adapter=adapter,
            tenant_id=tenant_id,
            cache_salt=cache_salt,
            output_kind=OutputKind.DELTA,
        )
        try:
            stream = self.engine.submit(request)
        except Exception as exc:
            raise _platform_error(exc) from None
        return _translated(stream)

    def abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._engine.abort(request_id)

    def sampling_params(self, **kwargs: Any) -> Any:
        """Engine SamplingParams; ``structured_output=(kind, value)`` is compiled here, in the
        caller's worker thread, so the request waits for its grammar and the engine loop does not."""
        from loraplex.engine import SamplingParams
        from loraplex.engine.sampling_params import StructuredOutputSpec

        spec = kwargs.pop("structured_output", None)
        if spec is not None:
            kwargs["structured_output"] = StructuredOutputSpec(*spec)
        params = SamplingParams(**kwargs)
        if params.structured_output is not None:
            self.engine.compile_structured(params.structured_output)
        return params

    @property
    def max_model_len(self) -> int:
        return int(self.engine.engine.max_model_len)


async def _translated(stream: Any) -> AsyncIterator[Any]:
    try:
        async for out in stream:
            yield out
    except Exception as exc:
        raise _platform_error(exc) from None
    finally:
        await stream.aclose()  # a consumer that stops early aborts the request


def _platform_error(exc: Exception) -> PlatformError:
    from loraplex.engine import EngineDeadError, InvalidRequestError, UnknownAdapterError

    if isinstance(exc, PlatformError):
        return exc
    if isinstance(exc, UnknownAdapterError):
        return NotFound(str(exc), param="model", code="model_not_found")
    if isinstance(exc, InvalidRequestError):
        return BadRequest(str(exc), param=exc.param)
    if isinstance(exc, EngineDeadError):
        return ServiceUnavailable(
            f"the inference engine is not running: {exc}", code="engine_unavailable", headers={"Retry-After": "5"}
        )
    log.exception("unexpected engine error")
    return ServiceUnavailable(f"the inference engine failed: {type(exc).__name__}: {exc}")
