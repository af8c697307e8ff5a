"""The one control plane of a Ray Serve deployment: a single Ray actor every ingress and engine
replica talks to.

It holds three facts that must mean the same thing on every replica:
- the quota counters (``InProcessQuotaStore``, the billing issue's reservations): an actor runs its
  methods one at a time, so "check rpm/tpm/concurrency/budget and reserve" is atomic across all
  ingress replicas without a database round trip or a row lock per request;
- the desired engine state (tenant priority/weight/cap, adapter key -> path in the shared store),
  with a version number: engine replicas pull it (at start, on a timer, and whenever a request
  carries a newer version than they have applied), so an upload, a new version, a deletion or a
  weight change reaches every replica, including one Serve starts later to replace a dead one;
- the replica registry: each engine replica reports its pid and live stats (heartbeats), which
  ``/admin/v1/engine`` shows.

Why an actor and not the database: see docs/scale-out.md.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime
from typing import Any

from loraplex.platform.errors import RateLimited
from loraplex.platform.quotas.store import InProcessQuotaStore, QuotaView, Reservation

ACTOR_NAME = "loraplex-control"
NAMESPACE = "loraplex"


class ControlPlane:
    """Plain class (tests can drive it without Ray); ``ray.remote`` makes it the actor.

    It heals: Ray restarts the actor (``max_restarts``) with the same arguments, and a new
    instance rebuilds everything it held from the outside: the desired engine state from the
    database, the replica registry from the replicas' next heartbeats, and the live reservations
    from the ingresses, which notice the new ``epoch`` and ``adopt`` theirs back."""

    def __init__(self, db_url: str, replica_ttl_s: float = 5.0, store_root: str | None = None) -> None:
        self._db_url = db_url
        self._store_root = store_root
        self._sessions: Any = None
        self._quotas = InProcessQuotaStore(self._tokens_since)
        self._reservations: dict[str, Reservation] = {}
        self.epoch = uuid.uuid4().hex  # a new instance (first start or restart) has a new epoch
        self.pid = os.getpid()
        # Versions only grow, across restarts too: a replica that applied version N of the old
        # instance must see the new instance's state as newer, never as N - k.
        self._version = time.time_ns() // 1_000_000
        self._tenants: dict[str, tuple[int, float, int | None]] = {}
        self._adapters: dict[str, str] = {}
        self._replicas: dict[str, dict[str, Any]] = {}
        self._service: dict[str, dict[str, float]] = {}  # replica -> tenant -> fair-share service
        self._retired: dict[str, float] = {}  # service of replicas that are gone, per tenant
        self._replica_ttl_s = replica_ttl_s
        self._draining = False
        self._ingresses: dict[str, dict[str, Any]] = {}
        self._aborts: list[dict[str, Any]] = []  # admin aborts every ingress applies (by sequence)
        self._abort_seq = 0
        if store_root is not None:
            self._rebuild_from_db()

    def _rebuild_from_db(self) -> None:
        """The desired engine state as the database has it (what every ingress pushed at start)."""
        from pathlib import Path

        from loraplex.platform.adapters import repository as adapters_repo
        from loraplex.platform.quotas import repository as quotas_repo
        from loraplex.platform.tenants import repository as tenants_repo

        assert self._store_root is not None
        with self._session_factory()() as session:
            quotas = {q.tenant_id: q for q in quotas_repo.all_quotas(session)}
            for t in tenants_repo.all_tenants(session):
                if t.status != "deleted":
                    q = quotas.get(t.id)
                    self._tenants[t.id] = (t.priority, t.weight, q.max_concurrent if q else None)
            for a in adapters_repo.served_adapters(session):
                if a.status == "active":
                    self._adapters[a.id] = str(Path(self._store_root) / a.storage_path)

    def _session_factory(self) -> Any:
        from loraplex.platform.db.session import make_db_engine, make_session_factory

        if self._sessions is None:
            self._sessions = make_session_factory(make_db_engine(self._db_url))
        return self._sessions

    # -- quotas (the QuotaStore calls, by reservation key) ---------------------------------
    def precheck(self, tenant_id: str, quota: QuotaView) -> dict[str, Any] | None:
        try:
            self._quotas.precheck(tenant_id, quota)
        except RateLimited as exc:
            return _refusal(exc)
        return None

    def reserve(self, tenant_id: str, quota: QuotaView, tokens: int) -> dict[str, Any]:
        try:
            res = self._quotas.reserve(tenant_id, quota, tokens)
        except RateLimited as exc:
            return {"refused": _refusal(exc)}
        key = uuid.uuid4().hex
        self._reservations[key] = res
        return {
            "key": key,
            "tokens": res.tokens,
            "headers": res.headers,
            "admitted_at": res.admitted_at,
            "epoch": self.epoch,
        }

    def settle(self, key: str, used_tokens: int) -> None:
        res = self._reservations.pop(key, None)
        if res is not None:
            self._quotas.settle(res, used_tokens)

    def cancel(self, key: str) -> None:
        res = self._reservations.pop(key, None)
        if res is not None:
            self._quotas.cancel(res)

    def running(self, tenant_id: str) -> int:
        return self._quotas.running(tenant_id)

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        return self._quotas.usage_now(tenant_id)

    def _tokens_since(self, tenant_id: str, since: datetime) -> int:
        """Tokens already billed this budget period (read once per tenant and period)."""
        from loraplex.platform.usage.repository import tokens_since

        with self._session_factory()() as session:
            return int(tokens_since(session, tenant_id, since))

    def adopt(self, held: list[dict[str, Any]]) -> int:
        """Live reservations an ingress held with the previous instance, re-held here under their
        keys (no limit checked: they were admitted already). Returns how many were new here."""
        adopted = 0
        for h in held:
            if h["key"] in self._reservations:
                continue
            # An empty view checks nothing; a budget view re-holds the tokens against the budget.
            view = (
                QuotaView(token_budget=2**62, budget_period=h["budget_period"]) if h["budget_period"] else QuotaView()
            )
            self._reservations[h["key"]] = self._quotas.reserve(h["tenant_id"], view, int(h["tokens"]))
            adopted += 1
        return adopted

    # -- desired engine state ----------------------------------------------------------------
    def set_tenant(self, tenant_id: str, priority: int, weight: float, max_running_seqs: int | None) -> int:
        value = (priority, weight, max_running_seqs)
        if self._tenants.get(tenant_id) != value:
            self._tenants[tenant_id] = value
            self._version += 1
        return self._version

    def add_adapter(self, key: str, path: str) -> int:
        if self._adapters.get(key) != path:
            self._adapters[key] = path
            self._version += 1
        return self._version

    def remove_adapter(self, key: str) -> int:
        if self._adapters.pop(key, None) is not None:
            self._version += 1
        return self._version

    def version(self) -> int:
        return self._version

    def state(self, known_version: int = -1) -> dict[str, Any] | None:
        """The whole desired state (it is small), or None when the caller is up to date."""
        if known_version == self._version:
            return None
        return {"version": self._version, "tenants": dict(self._tenants), "adapters": dict(self._adapters)}

    # -- replica registry --------------------------------------------------------------------
    def report(self, replica: str, info: dict[str, Any], service: dict[str, float] | None = None) -> dict[str, Any]:
        """A replica's heartbeat, with its cumulative fair-share service per tenant. Answers the
        state version and the service every OTHER replica gave each tenant (global VTC: the
        replica charges the growth of that to its own counters)."""
        self._replicas[replica] = {**info, "replica": replica, "seen": time.time()}
        if service is not None:
            self._service[replica] = service
        others: dict[str, float] = dict(self._retired)
        for name, served in self._service.items():
            if name != replica:
                for tid, amount in served.items():
                    others[tid] = others.get(tid, 0.0) + amount
        return {"version": self._version, "others": others}

    def forget(self, replica: str) -> None:
        self._replicas.pop(replica, None)
        self._retire(replica)

    def _retire(self, replica: str) -> None:
        """A gone replica's service still counts (the others have charged it already)."""
        for tid, amount in self._service.pop(replica, {}).items():
            self._retired[tid] = self._retired.get(tid, 0.0) + amount

    # -- what every ingress polls: registry, draining, admin aborts ---------------------------
    def snapshot(self, ingress: str, in_flight: int, abort_seq: int) -> dict[str, Any]:
        """One call per ingress tick: it reports its in-flight count and gets the replicas, the
        instance epoch, whether the deployment is draining, and the admin aborts after ``abort_seq``."""
        # draining_seen: this ingress has been told (the driver waits for every one before it
        # takes the app down, so a new request meets a 503, never a vanished route).
        self._ingresses[ingress] = {"in_flight": in_flight, "seen": time.time(), "draining_seen": self._draining}
        return {
            "epoch": self.epoch,
            "control": {"pid": self.pid, "epoch": self.epoch, "live_reservations": len(self._reservations)},
            "version": self._version,
            "replicas": self.replicas(),
            "draining": self._draining,
            "aborts": [a for a in self._aborts if a["seq"] > abort_seq],
            "abort_seq": self._abort_seq,
        }

    def broadcast_abort(self, reason: str, match: dict[str, str | None]) -> int:
        self._abort_seq += 1
        self._aborts.append({"seq": self._abort_seq, "reason": reason, "match": match})
        del self._aborts[:-256]  # an ingress more than 256 aborts behind has restarted anyway
        return self._abort_seq

    def set_draining(self, draining: bool = True) -> None:
        self._draining = draining

    def drain_acknowledged(self) -> bool:
        """Every ingress that polled recently has been told the deployment drains."""
        now = time.time()
        live = [i for i in self._ingresses.values() if now - i["seen"] < self._replica_ttl_s]
        return all(i["draining_seen"] for i in live)

    def live_reservations(self) -> int:
        """Admitted requests not settled yet, over every ingress (what a drain waits for)."""
        return len(self._reservations)

    def in_flight(self) -> int:
        """Requests in flight over every ingress that reported recently."""
        now = time.time()
        return sum(i["in_flight"] for i in self._ingresses.values() if now - i["seen"] < self._replica_ttl_s)

    def replicas(self) -> list[dict[str, Any]]:
        now = time.time()
        for name in [n for n, r in self._replicas.items() if now - r["seen"] > self._replica_ttl_s]:
            del self._replicas[name]  # no heartbeat: dead, or stopped by a scale-down
            self._retire(name)
        return sorted(self._replicas.values(), key=lambda r: r["replica"])


def _refusal(exc: RateLimited) -> dict[str, Any]:
    return {"message": exc.message, "code": exc.code, "headers": exc.headers}


def raise_refusal(refusal: dict[str, Any]) -> None:
    raise RateLimited(refusal["message"], code=refusal["code"], headers=refusal["headers"])
