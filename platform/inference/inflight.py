"""Requests in flight in this process, by tenant, key and adapter, so an operator's change (tenant
suspended or deleted, key revoked, adapter deleted) can stop them at the engine's next step. The
engine's abort ends each stream, and the request bills what it had delivered."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class InFlight:
    request_id: str
    tenant_id: str
    key_id: str
    adapter_id: str | None


class InflightRegistry:
    def __init__(self, peers: Callable[[str, dict[str, str | None]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, InFlight] = {}
        self._reasons: dict[str, str] = {}
        # Where an abort also goes: the other ingress replicas of a scale-out (reason, match).
        self.peers = peers

    def add(self, request_id: str, tenant_id: str, key_id: str, adapter_id: str | None) -> None:
        with self._lock:
            self._requests[request_id] = InFlight(request_id, tenant_id, key_id, adapter_id)

    def remove(self, request_id: str) -> None:
        with self._lock:
            self._requests.pop(request_id, None)
            self._reasons.pop(request_id, None)

    def mark(self, request_id: str, reason: str) -> None:
        """Say why a request is about to be aborted (read back by the request when it ends)."""
        with self._lock:
            if request_id in self._requests:
                self._reasons[request_id] = reason

    def reason(self, request_id: str) -> str | None:
        with self._lock:
            return self._reasons.get(request_id)

    def count(self) -> int:
        with self._lock:
            return len(self._requests)

    def abort(
        self,
        engine,
        reason: str,
        *,
        tenant_id: str | None = None,
        key_id: str | None = None,
        adapter_id: str | None = None,
        broadcast: bool = True,
    ) -> int:
        """Abort every request matching all the given fields (here, and on the other ingress
        replicas unless ``broadcast`` is False); returns how many were here."""
        if broadcast and self.peers is not None:
            self.peers(reason, {"tenant_id": tenant_id, "key_id": key_id, "adapter_id": adapter_id})
        with self._lock:
            hits = [
                r
                for r in self._requests.values()
                if (tenant_id is None or r.tenant_id == tenant_id)
                and (key_id is None or r.key_id == key_id)
                and (adapter_id is None or r.adapter_id == adapter_id)
            ]
            for r in hits:
                self._reasons[r.request_id] = reason
        for r in hits:
            engine.abort(r.request_id)
        return len(hits)
