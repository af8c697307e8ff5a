"""Who is there: the engine replicas (heartbeats with live stats, and their fair-share service for
global VTC) and the ingresses (what each has in flight, whether it has seen the drain, the admin
aborts every one of them applies)."""

from __future__ import annotations

import dataclasses
import time

from loraplex.platform.cluster.messages import Abort, AbortMatch, HeartbeatAnswer, ReplicaReport

ABORTS_KEPT = 256  # an ingress further behind than this has restarted anyway


class ReplicaRegistry:
    """Replicas that reported within ``ttl_s`` (one that stops is dead, or stopped by a
    scale-down). Each reports its cumulative fair-share service per tenant; the answer is what
    every OTHER replica served each tenant, which it charges to its own counters (global VTC)."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._replicas: dict[str, ReplicaReport] = {}
        self._service: dict[str, dict[str, float]] = {}  # replica -> tenant -> fair-share service
        self._retired: dict[str, float] = {}  # service of replicas that are gone, per tenant

    def report(self, report: ReplicaReport, service: dict[str, float] | None, version: int) -> HeartbeatAnswer:
        self._replicas[report.replica] = dataclasses.replace(report, seen=time.time())
        if service is not None:
            self._service[report.replica] = service
        others: dict[str, float] = dict(self._retired)
        for name, served in self._service.items():
            if name != report.replica:
                for tid, amount in served.items():
                    others[tid] = others.get(tid, 0.0) + amount
        return HeartbeatAnswer(version, others)

    def forget(self, replica: str) -> None:
        self._replicas.pop(replica, None)
        self._retire(replica)

    def _retire(self, replica: str) -> None:
        """A gone replica's service still counts (the others have charged it already)."""
        for tid, amount in self._service.pop(replica, {}).items():
            self._retired[tid] = self._retired.get(tid, 0.0) + amount

    def replicas(self) -> list[ReplicaReport]:
        now = time.time()
        for name in [n for n, r in self._replicas.items() if now - r.seen > self._ttl_s]:
            del self._replicas[name]  # no heartbeat: dead, or stopped by a scale-down
            self._retire(name)
        return sorted(self._replicas.values(), key=lambda r: r.replica)


@dataclasses.dataclass
class _IngressSeen:
    in_flight: int
    seen: float  # wall clock
    draining_seen: bool  # told that the deployment drains


class IngressBoard:
    """The ingresses' ticks: in-flight counts and whether each has been told of the drain (the
    driver waits for every one before it takes the app down, so a new request meets a 503, never
    a vanished route), and the admin aborts issued on any of them."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._ingresses: dict[str, _IngressSeen] = {}
        self.draining = False
        self._aborts: list[Abort] = []
        self.abort_seq = 0

    def tick(self, ingress: str, in_flight: int) -> None:
        self._ingresses[ingress] = _IngressSeen(in_flight, time.time(), self.draining)

    def _recent(self) -> list[_IngressSeen]:
        now = time.time()
        return [i for i in self._ingresses.values() if now - i.seen < self._ttl_s]

    def drain_acknowledged(self) -> bool:
        """Every ingress that polled recently has been told the deployment drains."""
        return all(i.draining_seen for i in self._recent())

    def in_flight(self) -> int:
        """Requests in flight over every ingress that reported recently."""
        return sum(i.in_flight for i in self._recent())

    def reporting(self) -> int:
        """How many ingresses reported recently."""
        return len(self._recent())

    def broadcast_abort(self, reason: str, match: AbortMatch) -> int:
        self.abort_seq += 1
        self._aborts.append(Abort(self.abort_seq, reason, match))
        del self._aborts[:-ABORTS_KEPT]
        return self.abort_seq

    def aborts_after(self, seq: int) -> list[Abort]:
        return [a for a in self._aborts if a.seq > seq]
