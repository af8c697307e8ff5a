"""Serving by-reference adapters: the first request for one fetches it (through the resolver's disk
cache) and registers it with the engine; later requests find it registered and never touch the
store. Disk-cache eviction unregisters it (requests running with it finish on their host copy)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loraplex.platform.adapters.models import Adapter
from loraplex.platform.adapters.sources.resolver import AdapterResolver, ContentChanged, Fetched, make_ref
from loraplex.platform.errors import PlatformError, ServiceUnavailable

log = logging.getLogger("loraplex.platform.adapters")


class ModelUnavailable(ServiceUnavailable):
    code = "model_unavailable"


def _engine_is_remote(gateway: Any) -> bool:
    """Scale-out: replicas resolve references themselves, so the ingress hands the reference on."""
    try:
        from loraplex.platform.cluster.remote_gateway import RemoteEngineGateway
    except ImportError:  # pragma: no cover - the cluster package is always there
        return False
    return isinstance(gateway, RemoteEngineGateway)


class ServedReferences:
    def __init__(self, resolver: AdapterResolver, gateway_fn: Callable[[], Any]) -> None:
        self.resolver = resolver
        self._gateway_fn = gateway_fn  # the context's gateway (it can be swapped after start)
        self._lock = threading.Lock()
        self._served: dict[str, str] = {}  # adapter id -> sha256 registered with the engine
        resolver.cache.on_evict = self._evicted

    def ensure_served(self, adapter: Adapter, on_changed: Callable[[Adapter, Fetched], None]) -> None:
        """Make ``adapter`` (by reference) usable by the engine, or raise 503 ``model_unavailable``
        with the reason. ``on_changed`` is called when the store holds new content (a new version)."""
        assert adapter.source_uri is not None
        with self._lock:
            if self._served.get(adapter.id) == adapter.sha256:
                return
        gateway = self._gateway_fn()
        ref = make_ref(adapter.source_uri, adapter.sha256)
        if _engine_is_remote(gateway):
            gateway.add_adapter(adapter.id, ref)  # each replica calls AdapterResolver.local_dir(ref)
        else:
            try:
                path = self.resolver.local_dir(ref)
            except ContentChanged as exc:
                on_changed(adapter, exc.fetched)
                raise
            except PlatformError as exc:
                raise ModelUnavailable(
                    f"the model {adapter.name!r} is unavailable: {exc.message}",
                    param="model",
                    headers={"retry-after": exc.headers.get("retry-after", "10")},
                ) from None
            self._register(gateway, adapter, path)
        with self._lock:
            self._served[adapter.id] = adapter.sha256

    def _register(self, gateway: Any, adapter: Adapter, path: Path) -> None:
        try:
            gateway.add_adapter(adapter.id, path)
        except PlatformError as exc:
            raise ModelUnavailable(f"the model {adapter.name!r} is unavailable: {exc.message}", param="model") from None

    def forget(self, adapter_id: str) -> None:
        """The adapter left the engine (deleted, superseded)."""
        with self._lock:
            self._served.pop(adapter_id, None)

    def is_served(self, adapter_id: str) -> bool:
        with self._lock:
            return adapter_id in self._served

    def _evicted(self, sha256: str) -> None:
        with self._lock:
            ids = [i for i, s in self._served.items() if s == sha256]
            for i in ids:
                del self._served[i]
        gateway = self._gateway_fn()
        for adapter_id in ids:
            gateway.remove_adapter(adapter_id)

    def stats(self) -> dict:
        with self._lock:
            served = len(self._served)
        return {"registered_in_engine": served, **self.resolver.stats()}

    def close(self) -> None:
        self.resolver.close()
