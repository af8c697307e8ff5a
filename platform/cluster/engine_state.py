"""The desired engine state of a scale-out: tenant priority/weight/cap and the adapter set, with a
version number. Ingresses write it (what the database says, pushed at start and after each admin
change); engine replicas pull it at start, on a timer, and whenever a request carries a newer
version than they applied, so an upload, a new version, a deletion or a weight change reaches
every replica, including one Serve starts later to replace a dead one.

Versions only grow, across restarts of the control plane too: they start at the instance's start
in milliseconds since the epoch, so a replica that applied version N of the old instance sees the
new instance's state as newer, never as N - k. A restarted instance rebuilds the state from the
database (``from_database``).
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.adapters.sources.uri import AdapterReference
from loraplex.platform.cluster.messages import AdapterSource, EngineState, StoredAdapter, TenantSettings


class DesiredEngineState:
    def __init__(self) -> None:
        self.version = time.time_ns() // 1_000_000
        self._tenants: dict[str, TenantSettings] = {}
        self._adapters: dict[str, AdapterSource] = {}

    @classmethod
    def from_database(cls, sessions: sessionmaker[Session], store_root: Path) -> DesiredEngineState:
        """What every ingress pushed at start, read back: tenants (not deleted) with their caps,
        and every active adapter, uploaded (its store folder) or by reference (for each replica
        to fetch itself)."""
        from loraplex.platform.adapters import repository as adapters_repo
        from loraplex.platform.quotas import repository as quotas_repo
        from loraplex.platform.tenants import repository as tenants_repo

        state = cls()
        with sessions() as session:
            quotas = {q.tenant_id: q for q in quotas_repo.all_quotas(session)}
            for t in tenants_repo.all_tenants(session):
                if t.status != "deleted":
                    q = quotas.get(t.id)
                    state._tenants[t.id] = TenantSettings(t.priority, t.weight, q.max_concurrent if q else None)
            for a in adapters_repo.served_adapters(session):
                if a.status != "active":
                    continue
                if a.source_uri:
                    state._adapters[a.id] = AdapterReference(a.source_uri, a.sha256)
                else:
                    state._adapters[a.id] = StoredAdapter(str(store_root / a.storage_path))
        return state

    def set_tenant(self, tenant_id: str, settings: TenantSettings) -> int:
        if self._tenants.get(tenant_id) != settings:
            self._tenants[tenant_id] = settings
            self.version += 1
        return self.version

    def add_adapter(self, key: str, source: AdapterSource) -> int:
        if self._adapters.get(key) != source:
            self._adapters[key] = source
            self.version += 1
        return self.version

    def remove_adapter(self, key: str) -> int:
        if self._adapters.pop(key, None) is not None:
            self.version += 1
        return self.version

    def since(self, known_version: int) -> EngineState | None:
        """The whole state (it is small), or None when the caller is up to date."""
        if known_version == self.version:
            return None
        return EngineState(self.version, dict(self._tenants), dict(self._adapters))
