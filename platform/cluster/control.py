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

Every reservation belongs to the ingress that made it and is held on a lease that the ingress's
calls renew (its snapshot tick, its reserves). An ingress silent for longer than
``ingress_lease_s`` is looked up in Ray's list of live ingress actors (``liveness.py``): one Ray no
longer holds (killed, its node gone) loses its holds, so the tenant's concurrency slots and tokens
come back without anyone restarting the actor; one still listed is only slow and keeps them
(releasing a live ingress's holds would let the others admit past a cap while its streams run). An
ingress Ray does not list by name (not a Serve actor) is released by the clock alone and, if it was
merely stalled, told so at its next snapshot (``readopt``) to hand its live reservations back, as
after a restart.

Why an actor and not the database: see docs/scale-out.md.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import datetime
from typing import Any

from loraplex.platform.cluster.liveness import IngressDirectory, RayIngressDirectory, Verdict
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

    def __init__(
        self,
        db_url: str,
        replica_ttl_s: float = 5.0,
        store_root: str | None = None,
        ingress_lease_s: float = 30.0,
        expected_ingresses: int = 0,
        adopt_grace_s: float = 10.0,
        ingress_prefix: str | None = None,
    ) -> None:
        self._db_url = db_url
        self._store_root = store_root
        self._sessions: Any = None
        self._quotas = InProcessQuotaStore(self._tokens_since)
        self._reservations: dict[str, Reservation] = {}
        self._owner: dict[str, str] = {}  # reservation key -> the ingress holding it ("": no lease)
        self._leases: dict[str, float] = {}  # ingress -> when it last called (monotonic)
        self._lapsed: set[str] = set()  # ingresses whose holds expired: told at their next snapshot
        self._lease_s = ingress_lease_s
        self._lease_released = 0  # holds released because their ingress went silent (admin view)
        self._ingress_dir: IngressDirectory = RayIngressDirectory(ingress_prefix)
        # A restarted instance starts with no holds: until every ingress has handed its live ones
        # back (``adopt``), a limited tenant's new hold could pass a cap that another ingress's
        # running requests already fill. So it asks for new limited holds to be sent again
        # ("retry") until every ingress that may hold slots and that Ray still holds alive has
        # reported — a frozen one too: it still holds real slots; one that dies leaves Ray's list
        # (and Serve replaces a frozen one when its health checks fail). "May hold slots": Ray's
        # GCS records each ingress's name when it first holds a reservation (``liveness.py``), so
        # Serve's replacement for an ingress killed with the actor, listed within seconds but
        # holding nothing until its start-up is done, is not waited for. Without the list (no Ray,
        # the GCS unreachable): until ``expected_ingresses`` have reported, for at most
        # ``adopt_grace_s``. A first start has nothing to wait for.
        self._reported: set[str] = set()
        self.started_at = time.time()  # wall clock: an operator (or a benchmark) compares it with a kill
        self.admitting_at: float | None = None  # when limited holds were admitted again
        self._restarted = _was_restarted()
        self._adopted_all = not self._restarted
        self._expected_ingresses = expected_ingresses if self._restarted else 0
        self._settle_until = time.monotonic() + adopt_grace_s
        # the ingresses that may hold slots: those recorded as holders (liveness.py), else every
        # one Ray lists now
        self._may_hold: frozenset[str] | None = None
        if self._restarted:
            self._may_hold = self._ingress_dir.holders()
            if self._may_hold is None:
                self._may_hold = self._ingress_dir.live()
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
        if self._adopted_all:
            self.admitting_at = time.time()

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

    def reserve(
        self, tenant_id: str, quota: QuotaView, tokens: int, owner: str = "", key: str | None = None
    ) -> dict[str, Any]:
        """Check every limit and hold. ``key`` (chosen by the caller) makes a repeated call a
        no-op that answers the same hold: an ingress may send it again after a lost answer."""
        self._renew(owner)
        key = key or uuid.uuid4().hex
        res = self._reservations.get(key)
        if res is None:
            if self._adopting() and not quota.unlimited:
                return {"retry": True, "epoch": self.epoch}
            try:
                res = self._quotas.reserve(tenant_id, quota, tokens)
            except RateLimited as exc:
                return {"refused": _refusal(exc)}
            self._hold(key, res, owner)
        return {
            "key": key,
            "tokens": res.tokens,
            "headers": res.headers,
            "admitted_at": res.admitted_at,
            "epoch": self.epoch,
        }

    def reserve_many(self, owner: str, items: list[tuple[str, str, QuotaView, int]]) -> list[dict[str, Any]]:
        """Several ``reserve`` calls of one ingress in one actor call, in order: (key, tenant,
        quota, tokens) each. An ingress batches the admissions that arrive while its previous
        batch is in flight, so a burst costs the actor a few calls, not one per request."""
        return [self.reserve(tenant, quota, tokens, owner, key) for key, tenant, quota, tokens in items]

    def _adopting(self) -> bool:
        """A restarted instance still waiting for the ingresses' live holds (see ``__init__``)."""
        if self._adopted_all:
            return False
        live = self._ingress_dir.live()
        if live is not None:
            if self._may_hold is None:  # the list was not readable at start: its first reading
                self._may_hold = live
            self._adopted_all = (self._may_hold & live) <= self._reported
        else:
            self._adopted_all = len(self._reported) >= self._expected_ingresses or time.monotonic() > self._settle_until
        if self._adopted_all:
            self.admitting_at = time.time()
        return not self._adopted_all

    def _hold(self, key: str, res: Reservation, owner: str) -> None:
        self._reservations[key] = res
        if owner:
            self._owner[key] = owner
            self._ingress_dir.held_by(owner)

    def settle(self, key: str, used_tokens: int) -> None:
        res = self._reservations.pop(key, None)
        self._owner.pop(key, None)
        if res is not None:
            self._quotas.settle(res, used_tokens)

    def cancel(self, key: str) -> None:
        res = self._reservations.pop(key, None)
        self._owner.pop(key, None)
        if res is not None:
            self._quotas.cancel(res)

    def running(self, tenant_id: str) -> int:
        self._expire_leases()
        return self._quotas.running(tenant_id)

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        self._expire_leases()
        return self._quotas.usage_now(tenant_id)

    # -- leases: the holds of an ingress that stopped calling go back --------------------------
    def _renew(self, owner: str) -> None:
        if owner:
            self._leases[owner] = time.monotonic()
        self._expire_leases()

    def _expire_leases(self) -> int:
        """Release the holds of every ingress silent for longer than the lease and not alive: gone
        from Ray's list, or not on it by name (``liveness.py``). Settled as serving nothing
        (slot and held tokens back; the request still counts against rpm: it was made). What it
        did deliver is in the usage ledger, recovered as interrupted."""
        now = time.monotonic()
        released = 0
        for owner in [o for o, seen in self._leases.items() if now - seen > self._lease_s]:
            verdict = self._ingress_dir.verdict(owner)
            if verdict is Verdict.ALIVE:  # Ray holds it: only slow, its holds stay
                self._leases[owner] = now
                continue
            if verdict is Verdict.UNKNOWN:  # the list unreadable for now: keep its holds meanwhile
                continue
            del self._leases[owner]
            if verdict is Verdict.UNNAMED:  # released on the clock alone: it may be stalled, not dead
                self._lapsed.add(owner)
            for key in [k for k, o in self._owner.items() if o == owner]:
                self.settle(key, 0)
                released += 1
        self._lease_released += released
        return released

    def _tokens_since(self, tenant_id: str, since: datetime) -> int:
        """Tokens already billed this budget period (read once per tenant and period)."""
        from loraplex.platform.usage.repository import tokens_since

        with self._session_factory()() as session:
            return int(tokens_since(session, tenant_id, since))

    def adopt(self, held: list[dict[str, Any]], owner: str = "") -> int:
        """Live reservations an ingress held with the previous instance (or before its lease
        lapsed), re-held here under their keys (no limit checked: they were admitted already).
        Returns how many were new here."""
        self._renew(owner)
        self._lapsed.discard(owner)
        if owner:
            self._reported.add(owner)
        adopted = 0
        for h in held:
            if h["key"] in self._reservations:
                continue
            # An empty view checks nothing; a budget view re-holds the tokens against the budget.
            view = (
                QuotaView(token_budget=2**62, budget_period=h["budget_period"]) if h["budget_period"] else QuotaView()
            )
            self._hold(h["key"], self._quotas.reserve(h["tenant_id"], view, int(h["tokens"])), owner)
            adopted += 1
        self._adopting()  # the last ingress to report ends the wait (admitting_at says when)
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
        self._expire_leases()  # ticks even when no ingress is left to call
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
        instance epoch, whether the deployment is draining, and the admin aborts after ``abort_seq``;
        the call renews the ingress's lease on its reservations (``readopt``: it had lapsed)."""
        self._renew(ingress)
        readopt = ingress in self._lapsed
        self._lapsed.discard(ingress)
        # draining_seen: this ingress has been told (the driver waits for every one before it
        # takes the app down, so a new request meets a 503, never a vanished route).
        self._ingresses[ingress] = {"in_flight": in_flight, "seen": time.time(), "draining_seen": self._draining}
        live = self._ingress_dir.live()
        return {
            "epoch": self.epoch,
            "readopt": readopt,
            "control": {
                "pid": self.pid,
                "epoch": self.epoch,
                "live_reservations": len(self._reservations),
                "ingresses": sorted(self._leases),
                # the ingress actors Ray holds alive (what a restarted instance waits for)
                "live_ingresses": None if live is None else sorted(live),
                "released_by_lease": self._lease_released,
                # this instance's start and when it admitted limited holds again (a restart waits
                # for the ingresses' adopts; wall clock, seconds)
                "started_at": self.started_at,
                "admitting_at": self.admitting_at,
                "restarted": self._restarted,
            },
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
        """Admitted requests not settled yet, over every ingress (what a drain waits for; a dead
        ingress's holds leave with its lease)."""
        self._expire_leases()
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


def _was_restarted() -> bool:
    """Whether this instance replaces one that died (Ray restarted the actor); False outside Ray."""
    try:
        import ray

        return bool(ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - not in an actor: a plain object (tests) is a first start
        return False
