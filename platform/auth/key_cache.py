"""A short-lived cache of tenant key lookups. Revoking a key, or changing its tenant, evicts the
entries at once, so a revoked key fails on the very next request of this process."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from loraplex.platform.projects.scope import ProjectAuth


@dataclass(frozen=True)
class TenantAuth:
    tenant_id: str
    tenant_name: str
    key_id: str
    tenant_status: str
    priority: int
    weight: float
    # The key's scope (platform/auth/key_scopes.py): None = everything its tenant may use / no own limit.
    allowed_models: tuple[str, ...] | None = None
    key_rpm: int | None = None
    key_tpm: int | None = None
    key_max_concurrent: int | None = None
    project: ProjectAuth | None = None  # the key's project (platform/projects/scope.py)


class KeyCache:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, TenantAuth]] = {}
        self._lock = threading.Lock()

    def get(self, key_hash: str) -> TenantAuth | None:
        with self._lock:
            hit = self._entries.get(key_hash)
            if hit is None:
                return None
            if hit[0] < time.monotonic():
                del self._entries[key_hash]
                return None
            return hit[1]

    def put(self, key_hash: str, auth: TenantAuth, ttl_s: float | None = None) -> None:
        ttl = self.ttl_s if ttl_s is None else min(self.ttl_s, ttl_s)
        if ttl <= 0:
            return
        with self._lock:
            self._entries[key_hash] = (time.monotonic() + ttl, auth)

    def evict_hash(self, key_hash: str) -> None:
        with self._lock:
            self._entries.pop(key_hash, None)

    def evict_tenant(self, tenant_id: str) -> None:
        with self._lock:
            for h in [h for h, (_, a) in self._entries.items() if a.tenant_id == tenant_id]:
                del self._entries[h]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
