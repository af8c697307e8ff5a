"""Serving by-reference adapters: the first request for one fetches it (through the resolver's disk
cache) and registers it with the engine; later requests find it registered and never touch the
store. Disk-cache eviction unregisters it (requests running with it finish on their host copy).

An engine that fetches references itself (``EngineClient.resolves_references()``: the replicas of
a scale-out, each into its own cache) is handed the reference instead: nothing is downloaded here,
and this process's cache (and its evictions) never concerns those engines."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from loraplex.platform.adapters.models import Adapter
from loraplex.platform.adapters.sources.fetchers import SourceNotFound
from loraplex.platform.adapters.sources.resolver import AdapterResolver, ContentChanged, Fetched
from loraplex.platform.adapters.sources.uri import AdapterReference
from loraplex.platform.engine_client.protocol import EngineClient
from loraplex.platform.errors import BadRequest, PlatformError, ServiceUnavailable

log = logging.getLogger("loraplex.platform.adapters")

PIN_S = 10.0  # an admitted request reaches the engine's queue well within this


class ModelUnavailable(ServiceUnavailable):
    code = "model_unavailable"


class ModelRefused(BadRequest):
    """The adapter's source now refuses it (e.g. a link put into a file:// path after registration):
    retrying cannot help, so not a 503."""

    code = "model_source_refused"


def _unavailable(adapter: Adapter, exc: PlatformError) -> PlatformError:
    """A store error as the requesting client's error: 503 + Retry-After when it may pass (down,
    slow, busy), 400 when the source itself is refused (a link, a hostile object)."""
    if exc.status_code < 500 and not isinstance(exc, SourceNotFound):  # gone objects may come back
        return ModelRefused(f"the model {adapter.name!r} cannot be served: {exc.message}", param="model")
    return ModelUnavailable(
        f"the model {adapter.name!r} is unavailable: {exc.message}",
        param="model",
        headers={"retry-after": exc.headers.get("retry-after", "10")},
    )


class ServedReferences:
    def __init__(self, resolver: AdapterResolver, engine: EngineClient) -> None:
        self.resolver = resolver
        self._engine = engine
        self._lock = threading.Lock()
        self._served: dict[str, str] = {}  # adapter id -> sha256 registered with the engine
        self._resolved_at: dict[str, float] = {}  # adapter id -> last admission that used it
        self._registering: dict[str, str] = {}  # adapter id -> sha256 being fetched and loaded
        resolver.cache.on_evict = self._evicted
        resolver.cache.pinned = self._pinned
        resolver.cache.release = self._release
        self._released: dict[str, list[str]] = {}  # sha256 -> adapter ids to take out of the engine

    def ensure_served(self, adapter: Adapter, on_changed: Callable[[Adapter, Fetched], None]) -> None:
        """Make ``adapter`` (by reference) usable by the engine, or raise 503 ``model_unavailable``
        with the reason. ``on_changed`` is called when the store holds new content (a new version).
        Blocks this thread on the store: never call it holding a database connection (the request
        path uses ``ensure_served_async``)."""
        assert adapter.source_uri is not None
        if self._is_current(adapter):
            return
        engine = self._engine
        if engine.resolves_references():
            engine.add_adapter_reference(adapter.id, AdapterReference(adapter.source_uri, adapter.sha256))
        else:
            with self._pinned_while_loading(adapter):
                try:
                    path = self._checked(
                        adapter, self.resolver.fetch(adapter.source_uri, expected_sha256=adapter.sha256)
                    )
                except ContentChanged as exc:
                    on_changed(adapter, exc.fetched)
                    raise
                except PlatformError as exc:
                    raise _unavailable(adapter, exc) from None
                self._register(engine, adapter, path)
        with self._lock:
            self._served[adapter.id] = adapter.sha256

    async def ensure_served_async(self, adapter: Adapter) -> Fetched | None:
        """``ensure_served`` on the event loop: the wait for the store holds no thread and no
        database connection. Returns the fetched content when it is NOT the registered one (the
        caller records the new version, in a short transaction of its own, and serves that)."""
        assert adapter.source_uri is not None
        if self._is_current(adapter):
            return None
        engine = self._engine
        if engine.resolves_references():
            ref = AdapterReference(adapter.source_uri, adapter.sha256)
            await asyncio.to_thread(engine.add_adapter_reference, adapter.id, ref)
        else:
            with self._pinned_while_loading(adapter):
                try:
                    fetched = await self.resolver.fetch_async(adapter.source_uri, expected_sha256=adapter.sha256)
                except PlatformError as exc:
                    raise _unavailable(adapter, exc) from None
                if fetched.sha256 != adapter.sha256:
                    return fetched
                await asyncio.to_thread(self._register, engine, adapter, fetched.path)
        with self._lock:
            self._served[adapter.id] = adapter.sha256
        return None

    def _is_current(self, adapter: Adapter) -> bool:
        with self._lock:
            self._resolved_at[adapter.id] = time.monotonic()
            return self._served.get(adapter.id) == adapter.sha256

    @contextmanager
    def _pinned_while_loading(self, adapter: Adapter) -> Iterator[None]:
        with self._lock:  # pinned in the disk cache until the engine has loaded it
            self._registering[adapter.id] = adapter.sha256
        try:
            yield
        finally:
            with self._lock:
                self._registering.pop(adapter.id, None)

    @staticmethod
    def _checked(adapter: Adapter, fetched: Fetched) -> Path:
        if fetched.sha256 != adapter.sha256:
            assert adapter.source_uri is not None
            raise ContentChanged(adapter.source_uri, adapter.sha256, fetched)
        return fetched.path

    def _register(self, engine: EngineClient, adapter: Adapter, path: Path) -> None:
        try:
            engine.add_adapter(adapter.id, path)
        except PlatformError as exc:
            raise ModelUnavailable(f"the model {adapter.name!r} is unavailable: {exc.message}", param="model") from None

    def forget(self, adapter_id: str) -> None:
        """The adapter left the engine (deleted, superseded)."""
        with self._lock:
            self._served.pop(adapter_id, None)

    def is_served(self, adapter_id: str) -> bool:
        with self._lock:
            return adapter_id in self._served

    def _pinned(self) -> set[str]:
        """Contents with requests queued or running in the engine (a snapshot, outside any lock)."""
        try:
            lora = self._engine.stats().get("lora")
            running = lora.get("active_requests") if isinstance(lora, dict) else None
            active = set(running) if isinstance(running, dict) else set()
        except Exception:  # noqa: BLE001 - no engine: nothing reads the cache
            active = set()
        horizon = time.monotonic() - PIN_S
        with self._lock:
            for i in [i for i, t in self._resolved_at.items() if t < horizon]:
                del self._resolved_at[i]
            return {self._served[i] for i in active if i in self._served}

    def _release(self, sha256: str) -> bool:
        """May the disk cache remove ``sha256``? Not while it is being loaded or was admitted in
        the last ``PIN_S`` seconds; otherwise it stops being served here (atomically with that check)."""
        horizon = time.monotonic() - PIN_S
        with self._lock:
            if sha256 in self._registering.values():
                return False
            ids = [i for i, s in self._served.items() if s == sha256]
            if any(self._resolved_at.get(i, 0.0) >= horizon for i in ids):
                return False
            for i in ids:
                del self._served[i]
            self._released[sha256] = ids
            return True

    def _evicted(self, sha256: str) -> None:
        with self._lock:
            ids = self._released.pop(sha256, [])
        engine = self._engine
        for adapter_id in ids:
            engine.remove_adapter(adapter_id)
        with self._lock:  # re-added meanwhile by a racing first request: register again next time
            for adapter_id in ids:
                if self._served.get(adapter_id) == sha256:
                    del self._served[adapter_id]

    def stats(self) -> dict:
        with self._lock:
            served = len(self._served)
        return {"registered_in_engine": served, **self.resolver.stats()}

    def close(self) -> None:
        self.resolver.close()
