"""The one control plane of a Ray Serve deployment: a single Ray actor every ingress and engine
replica talks to. It holds three facts that must mean the same thing on every replica, each in a
component of its own:

- ``ReservationBook`` (``reservations.py``): the quota counters (``InProcessQuotaStore``, the
  billing issue's reservations) and the ingresses' leases on their holds. An actor runs its
  methods one at a time, so "check rpm/tpm/concurrency/budget and reserve" is atomic across all
  ingress replicas without a database round trip or a row lock per request;
- ``DesiredEngineState`` (``engine_state.py``): tenant priority/weight/cap and the adapter set,
  with a version number, which every engine replica pulls;
- ``ReplicaRegistry`` and ``IngressBoard`` (``registry.py``): the replicas' heartbeats (live stats
  for ``/admin/v1/engine``, fair-share service for global VTC) and the ingresses' ticks (in-flight
  counts, the drain, admin aborts).

``ControlPlane`` is only the actor's surface: each remote method is one component's call, except
``snapshot`` (an ingress's tick), which reads them all. Messages are ``messages.py``'s types.

Why an actor and not the database: see docs/scale-out.md.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.alerts.limits import LimitAlerts
from loraplex.platform.alerts.outbox import Outbox
from loraplex.platform.alerts.queued import QueuedEmitter
from loraplex.platform.cluster.engine_state import DesiredEngineState
from loraplex.platform.cluster.liveness import RayIngressDirectory
from loraplex.platform.cluster.messages import (
    AbortMatch,
    AdapterSource,
    ControlStatus,
    DrainProgress,
    EngineState,
    HeartbeatAnswer,
    HeldReservation,
    ReplicaReport,
    ReserveAnswer,
    ReserveItem,
    Snapshot,
    TenantSettings,
)
from loraplex.platform.cluster.registry import IngressBoard, ReplicaRegistry
from loraplex.platform.cluster.reservations import ReservationBook

ACTOR_NAME = "loraplex-control"
NAMESPACE = "loraplex"


@dataclass(frozen=True)
class ControlConfig:
    """The actor's constructor arguments (``deploy.start_control`` builds them from settings); Ray
    passes the same ones to a restarted instance."""

    db_url: str
    store_root: str | None = None  # the adapter store: None = no database state to rebuild (tests)
    replica_ttl_s: float = 5.0  # a replica (or ingress) silent this long is gone
    ingress_lease_s: float = 30.0
    expected_ingresses: int = 0  # without Ray's list: the ingresses a restart waits for
    adopt_grace_s: float = 10.0  # ... for at most this long
    ingress_prefix: str | None = None  # Ray's actor names of the ingresses (liveness.py)
    # limit alerts (platform/alerts): the thresholds; None = alerts off (no events recorded)
    alert_thresholds: tuple[int, ...] | None = None


class ControlPlane:
    """Plain class (tests can drive it without Ray); ``ray.remote`` makes it the actor.

    It heals: Ray restarts the actor (``max_restarts``) with the same arguments, and a new
    instance rebuilds everything it held from the outside: the desired engine state from the
    database, the replica registry from the replicas' next heartbeats, and the live reservations
    from the ingresses, which notice the new ``epoch`` and ``adopt`` theirs back."""

    def __init__(self, config: ControlConfig) -> None:
        self._db_url = config.db_url
        self._sessions: sessionmaker[Session] | None = None
        self.epoch = uuid.uuid4().hex  # a new instance (first start or restart) has a new epoch
        self.pid = os.getpid()
        self.started_at = time.time()  # wall clock: an operator (or a benchmark) compares it with a kill
        self.alert_writer: QueuedEmitter | None = None
        alerts = None
        if config.alert_thresholds is not None:
            # the ingresses' dispatchers deliver them: the outbox is the shared database
            self.alert_writer = QueuedEmitter(Outbox(self._session_factory()))
            alerts = LimitAlerts(self.alert_writer, tuple(config.alert_thresholds))
        self.holds = ReservationBook(
            self._tokens_since,
            RayIngressDirectory(config.ingress_prefix),
            epoch=self.epoch,
            restarted=_was_restarted(),
            lease_s=config.ingress_lease_s,
            expected_ingresses=config.expected_ingresses,
            adopt_grace_s=config.adopt_grace_s,
            alerts=alerts,
        )
        self.desired = (
            DesiredEngineState.from_database(self._session_factory(), Path(config.store_root))
            if config.store_root is not None
            else DesiredEngineState()
        )
        self.replica_registry = ReplicaRegistry(config.replica_ttl_s)
        self.ingresses = IngressBoard(config.replica_ttl_s)

    def _session_factory(self) -> sessionmaker[Session]:
        from loraplex.platform.db.session import make_db_engine, make_session_factory

        if self._sessions is None:
            self._sessions = make_session_factory(make_db_engine(self._db_url))
        return self._sessions

    def _tokens_since(self, tenant_id: str, since: datetime) -> int:
        """Tokens already billed this budget period (read once per tenant and period)."""
        from loraplex.platform.usage.repository import tokens_since

        with self._session_factory()() as session:
            return int(tokens_since(session, tenant_id, since))

    # -- quota holds (ActorQuotaStore) -------------------------------------------------------
    def reserve_many(self, owner: str, items: list[ReserveItem]) -> list[ReserveAnswer]:
        """Reserves of one ingress in one actor call, in order. An ingress batches the admissions
        that arrive while its previous batch is in flight, so a burst costs the actor a few calls,
        not one per request."""
        return [self.holds.reserve(item, owner) for item in items]

    def settle(self, key: str, used_tokens: int) -> None:
        self.holds.settle(key, used_tokens)

    def cancel(self, key: str) -> None:
        self.holds.cancel(key)

    def running(self, tenant_id: str) -> int:
        return self.holds.running(tenant_id)

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        return self.holds.usage_now(tenant_id)

    def adopt(self, held: list[HeldReservation], owner: str = "") -> int:
        return self.holds.adopt(held, owner)

    def live_reservations(self) -> int:
        """Admitted requests not settled yet, over every ingress."""
        return self.holds.live()

    def drain_progress(self) -> DrainProgress:
        """What the driver's drain waits for (``drain.py``)."""
        return DrainProgress(
            reservations=self.holds.live(),
            in_flight=self.ingresses.in_flight(),
            ingresses=self.ingresses.reporting(),
            by_owner=self.holds.by_owner(),
        )

    # -- desired engine state (RemoteEngineClient writes, replicas pull) ---------------------
    def set_tenant(self, tenant_id: str, settings: TenantSettings) -> int:
        return self.desired.set_tenant(tenant_id, settings)

    def add_adapter(self, key: str, source: AdapterSource) -> int:
        return self.desired.add_adapter(key, source)

    def remove_adapter(self, key: str) -> int:
        return self.desired.remove_adapter(key)

    def state(self, known_version: int = -1) -> EngineState | None:
        return self.desired.since(known_version)

    # -- replica registry --------------------------------------------------------------------
    def report(self, report: ReplicaReport, service: dict[str, float] | None = None) -> HeartbeatAnswer:
        """A replica's heartbeat, with its cumulative fair-share service per tenant."""
        self.holds.expire_leases()  # ticks even when no ingress is left to call
        return self.replica_registry.report(report, service, self.desired.version)

    def forget(self, replica: str) -> None:
        self.replica_registry.forget(replica)

    # -- the ingresses: their tick, admin aborts, the drain -----------------------------------
    def snapshot(self, ingress: str, in_flight: int, abort_seq: int) -> Snapshot:
        """One call per ingress tick: it reports its in-flight count and gets the replicas, the
        instance epoch, whether the deployment is draining, and the admin aborts after
        ``abort_seq``; the call renews the ingress's lease on its reservations."""
        self.holds.renew(ingress)
        self.ingresses.tick(ingress, in_flight)
        return Snapshot(
            epoch=self.epoch,
            readopt=self.holds.lapsed(ingress),
            control=self.status(),
            version=self.desired.version,
            replicas=self.replica_registry.replicas(),
            draining=self.ingresses.draining,
            aborts=self.ingresses.aborts_after(abort_seq),
            abort_seq=self.ingresses.abort_seq,
        )

    def status(self) -> ControlStatus:
        live = self.holds.live_ingresses()
        return ControlStatus(
            pid=self.pid,
            epoch=self.epoch,
            live_reservations=self.holds.live(),
            ingresses=self.holds.leaseholders(),
            live_ingresses=None if live is None else sorted(live),
            released_by_lease=self.holds.released_by_lease,
            started_at=self.started_at,
            admitting_at=self.holds.admitting_at,
            restarted=self.holds.restarted,
        )

    def broadcast_abort(self, reason: str, match: AbortMatch) -> int:
        return self.ingresses.broadcast_abort(reason, match)

    def set_draining(self, draining: bool = True) -> None:
        self.ingresses.draining = draining

    def drain_acknowledged(self) -> bool:
        return self.ingresses.drain_acknowledged()


def _was_restarted() -> bool:
    """Whether this instance replaces one that died (Ray restarted the actor); False outside Ray."""
    try:
        import ray

        return bool(ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - not in an actor: a plain object (tests) is a first start
        return False
