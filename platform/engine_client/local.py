"""``LocalEngineClient``: the ``EngineClient`` over an ``AsyncEngine`` running in this process (or
none: a server with the engine disabled, or the CLI that only validates adapters)."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from loraplex.platform.engine_client import shared
from loraplex.platform.engine_client.protocol import AdapterFacts, EngineStats
from loraplex.platform.errors import ServiceUnavailable
from loraplex.platform.settings import Settings, engine_config_kwargs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loraplex.engine import (
        AsyncEngine,
        FairGroup,
        RequestOutput,
        RequestStream,
        SamplingParams,
        StructuredOutputSpec,
    )
    from loraplex.platform.adapters.sources.resolver import AdapterResolver
    from loraplex.platform.adapters.sources.uri import AdapterReference

log = logging.getLogger("loraplex.platform.engine")


class LocalStream:
    """An engine ``RequestStream`` with engine errors turned into platform errors."""

    def __init__(self, stream: RequestStream) -> None:
        self._stream = stream
        self.replica = ""

    async def open(self) -> None:  # the local engine validated the request at submit
        return None

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self

    async def __anext__(self) -> RequestOutput:
        try:
            return await self._stream.__anext__()
        except StopAsyncIteration:
            raise
        except Exception as exc:
            await self._stream.aclose()
            raise shared.platform_error(exc) from None

    async def aclose(self) -> None:
        await self._stream.aclose()  # a consumer that stops early aborts the request


class LocalEngineClient:
    """``references``: set where this engine fetches by-reference adapters itself (an engine
    replica of a scale-out, into its own disk cache); None in one process, where the platform's
    ``ServedReferences`` fetches them (disk cache shared with the admin API, pins, new versions)."""

    def __init__(
        self,
        engine: AsyncEngine | None,
        model_dir: Path | None,
        max_lora_rank: int,
        *,
        references: AdapterResolver | None = None,
    ) -> None:
        self._engine = engine
        self._model_dir = model_dir
        self.max_lora_rank = max_lora_rank
        self._references = references
        self._lock = threading.Lock()
        self._adapters: dict[str, str] = {}  # engine key -> path, for stats and idempotence
        self._max_prompt_chars: int | None = None

    @classmethod
    def disabled(cls) -> LocalEngineClient:
        return cls(None, None, 0)

    @classmethod
    def validator_only(cls, settings: Settings) -> LocalEngineClient:
        """No running engine, but adapters can be validated against the base model (CLI)."""
        return cls(None, shared.resolve_model_dir(settings), settings.engine.max_lora_rank)

    @classmethod
    def start(cls, settings: Settings, *, references: AdapterResolver | None = None) -> LocalEngineClient:
        if not settings.engine.enabled:
            return cls.disabled()
        from loraplex.engine import AsyncEngine, EngineConfig

        model_dir = shared.resolve_model_dir(settings)
        config = EngineConfig(model=str(model_dir), **engine_config_kwargs(settings.engine))
        engine = AsyncEngine(config)
        engine.start()
        log.info("engine started on %s", model_dir)
        return cls(engine, model_dir, settings.engine.max_lora_rank, references=references)

    @property
    def enabled(self) -> bool:
        return self._engine is not None

    @property
    def alive(self) -> bool:
        """The engine loop is running and taking work (False when disabled, stopped or dead)."""
        return self._engine is not None and self._engine.is_running

    @property
    def failure(self) -> str | None:
        """Why the engine loop died (None while it runs, or when it was shut down)."""
        dead = self._engine.dead if self._engine is not None else None
        return repr(dead) if dead is not None else None

    def inject_fault(self) -> None:
        """Kill the engine loop the way a bug in a step would (the debug route behind
        ``server.fault_injection``)."""
        self.engine.inject_fault()

    @property
    def replica_name(self) -> str:
        """Names this engine in ``x-loraplex-replica`` (one process: host and pid)."""
        return f"{socket.gethostname()}-{os.getpid()}"

    @property
    def model_dir(self) -> Path | None:
        return self._model_dir

    @property
    def model_name(self) -> str:
        return self._model_dir.name if self._model_dir else ""

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise ServiceUnavailable("the inference engine is disabled on this server")
        return self._engine

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return int(self.engine.engine.max_model_len)

    def max_prompt_chars(self) -> int | None:
        if self._max_prompt_chars is None and self._engine is not None:
            self._max_prompt_chars = shared.max_prompt_chars(self.tokenizer, self.max_model_len)
        return self._max_prompt_chars

    def resolved_config(self) -> dict[str, object]:
        """The engine configuration with every ``auto`` resolved (printed by ``serve``)."""
        from loraplex.engine import resolved_config

        return dict(resolved_config(self.engine.engine))

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    # -- requests ---------------------------------------------------------------------------
    def check_sampling(self, params: SamplingParams, *, tenant_id: str | None) -> None:
        """Compiled in the caller's worker thread: the request waits for its grammar, the loop does not."""
        engine = self.engine.engine
        shared.check_sampling(params, tenant_id, engine.structured, engine.limits)

    def compile_structured(self, spec: StructuredOutputSpec) -> None:
        """A grammar built elsewhere (an ingress) compiled into this engine's cache, off the loop."""
        try:
            self.engine.compile_structured(spec)
        except Exception as exc:
            raise shared.platform_error(exc) from None

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        adapter: str | None,
        tenant_id: str,
        cache_salt: str | None,
        resume_token_ids: list[int] | None = None,
        fair_group: FairGroup | None = None,
    ) -> LocalStream:
        """Queue a generation. Every engine error comes out as a platform error (a bad request is
        a 4xx, a dead engine a 503), at submit or while iterating. ``resume_token_ids``: the output
        another engine already generated (a scale-out replica continuing a dead one's request)."""
        from loraplex.engine import EngineRequest, OutputKind

        request = EngineRequest(
            prompt_token_ids,
            params,
            request_id=request_id,
            adapter=adapter,
            tenant_id=tenant_id,
            fair_group=fair_group,
            cache_salt=cache_salt,
            output_kind=OutputKind.DELTA,
            resume_token_ids=list(resume_token_ids or ()),
        )
        try:
            return LocalStream(self.engine.submit(request))
        except Exception as exc:
            raise shared.platform_error(exc) from None

    def abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._engine.abort(request_id)

    # -- control ----------------------------------------------------------------------------
    def set_tenant(self, tenant_id: str, priority: int, weight: float, max_running_seqs: int | None) -> None:
        if self._engine is not None:
            # None clears the tenant's own cap (the engine-wide default applies again).
            try:
                self._engine.set_tenant(tenant_id, priority=priority, weight=weight, max_running_seqs=max_running_seqs)
            except Exception as exc:
                raise shared.platform_error(exc) from None

    def validate_adapter(self, path: Path) -> AdapterFacts:
        return shared.validate_adapter(path, self._model_dir, self.max_lora_rank)

    def add_adapter(self, key: str, path: Path) -> None:
        with self._lock:
            if self._engine is not None and key not in self._adapters:
                try:
                    self._engine.add_adapter(key, str(path))
                except Exception as exc:  # e.g. an engine built without LoRA support
                    raise ServiceUnavailable(f"the engine could not load the adapter: {exc}") from exc
            self._adapters[key] = str(path)

    def resolves_references(self) -> bool:
        return self._references is not None

    def add_adapter_reference(self, key: str, ref: AdapterReference) -> None:
        """Fetched into this engine's own disk cache (once; later calls find it there), then
        registered like a folder. A store error is the caller's: the replica reports it."""
        if self._references is None:
            raise ServiceUnavailable("this engine does not fetch adapters itself (the platform does)")
        self.add_adapter(key, self._references.local_dir(ref))

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

    def exchange_fair_service(self, external: dict[str, float]) -> dict[str, float]:
        """Global fairness of a scale-out (one replica's side, see ``cluster/replica.py``)."""
        if self._engine is None:
            return {}
        return self._engine.exchange_fair_service(external)

    def stats(self) -> EngineStats:
        if self._engine is None:
            return {"enabled": False}
        try:
            return {"enabled": True, "model": self.model_name, **self._engine.stats()}
        except Exception as exc:
            raise shared.platform_error(exc) from None
