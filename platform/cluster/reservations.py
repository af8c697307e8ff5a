"""The control plane's quota holds: the one ``InProcessQuotaStore`` every ingress admits through,
each hold on the lease of the ingress that made it, and the wait for the ingresses' live holds
after a restart.

Every reservation belongs to the ingress that made it and is held on a lease that the ingress's
calls renew (its snapshot tick, its reserves). An ingress silent for longer than the lease is
looked up in Ray's list of live ingress actors (``liveness.py``): one Ray no longer holds (killed,
its node gone) loses its holds, so the tenant's concurrency slots and tokens come back without
anyone restarting the actor; one still listed is only slow and keeps them (releasing a live
ingress's holds would let the others admit past a cap while its streams run). An ingress Ray does
not list by name (not a Serve actor) is released by the clock alone and, if it was merely stalled,
told so at its next snapshot (``readopt``) to hand its live reservations back, as after a restart.

A restarted instance starts with no holds: until every ingress has handed its live ones back
(``adopt``), a limited tenant's new hold could pass a cap that another ingress's running requests
already fill. So it answers ``Retry`` to new limited holds until every ingress that may hold slots
and that Ray still holds alive has reported — a frozen one too: it still holds real slots; one
that dies leaves Ray's list (and Serve replaces a frozen one when its health checks fail). "May
hold slots": Ray's GCS records each ingress's name when it first holds a reservation
(``liveness.py``), so Serve's replacement for an ingress killed with the actor, listed within
seconds but holding nothing until its start-up is done, is not waited for. Without the list (no
Ray, the GCS unreachable): until ``expected_ingresses`` have reported, for at most
``adopt_grace_s``. A first start has nothing to wait for.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime

from loraplex.platform.alerts.limits import LimitAlerts
from loraplex.platform.cluster.liveness import IngressDirectory, Verdict
from loraplex.platform.cluster.messages import HeldReservation, Hold, Refusal, ReserveAnswer, ReserveItem, Retry
from loraplex.platform.errors import RateLimited
from loraplex.platform.quotas.store import InProcessQuotaStore, QuotaView, Reservation

ENDED_KEPT = 65_536  # ended keys remembered (measured ~10 MB); a call late by more than that many ends is not expected


class ReservationBook:
    def __init__(
        self,
        tokens_since: Callable[[str, datetime], int],
        ingresses: IngressDirectory,
        *,
        epoch: str,
        restarted: bool,
        lease_s: float,
        expected_ingresses: int,
        adopt_grace_s: float,
        alerts: LimitAlerts | None = None,
    ) -> None:
        # ``alerts``: the same threshold/refusal events the local store raises (platform/alerts),
        # through an emitter that never makes the actor wait on the database (alerts/queued.py)
        self._quotas = InProcessQuotaStore(tokens_since, alerts=alerts)
        self._ingresses = ingresses
        self._epoch = epoch
        self._reservations: dict[str, Reservation] = {}
        self._owner: dict[str, str] = {}  # reservation key -> the ingress holding it ("": no lease)
        self._leases: dict[str, float] = {}  # ingress -> when it last called (monotonic)
        self._lapsed: set[str] = set()  # ingresses whose holds expired: told at their next snapshot
        # Keys settled or cancelled here, newest last: an adopt or a reserve of one of them that
        # arrives after its end (calls from different threads, or a call retried across a restart,
        # are not ordered) must not hold it again: nothing would ever settle it (a leaked slot,
        # and a drain waiting for it)
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._lease_s = lease_s
        self.released_by_lease = 0  # holds released because their ingress went silent (admin view)
        self._reported: set[str] = set()  # ingresses that handed their holds back to this instance
        self.restarted = restarted
        self.admitting_at: float | None = None  # wall clock: when limited holds were admitted again
        self._adopted_all = not restarted
        self._expected_ingresses = expected_ingresses if restarted else 0
        self._settle_until = time.monotonic() + adopt_grace_s
        # the ingresses that may hold slots: those recorded as holders (liveness.py), else every
        # one Ray lists now
        self._may_hold: frozenset[str] | None = None
        if restarted:
            self._may_hold = ingresses.holders()
            if self._may_hold is None:
                self._may_hold = ingresses.live()
        else:
            self.admitting_at = time.time()

    # -- holds -----------------------------------------------------------------------------------
    def reserve(self, item: ReserveItem, owner: str = "") -> ReserveAnswer:
        """Check every limit and hold; a key already held is answered with its hold."""
        self.renew(owner)
        res = self._reservations.get(item.key)
        if res is None and item.key in self._ended:  # its cancel came first: the caller gave up
            return Refusal("the admission was withdrawn before it was held", "request_cancelled", {})
        if res is None:
            if self._adopting() and not item.quota.unlimited:
                return Retry(self._epoch)
            try:
                res = self._quotas.reserve(item.tenant_id, item.quota, item.tokens)
            except RateLimited as exc:
                return Refusal.of(exc)
            self._hold(item.key, res, owner)
        return Hold(item.key, res.tokens, res.headers, res.admitted_at, self._epoch)

    def _hold(self, key: str, res: Reservation, owner: str) -> None:
        self._reservations[key] = res
        if owner:
            self._owner[key] = owner
            self._ingresses.held_by(owner)

    def settle(self, key: str, used_tokens: int) -> None:
        """The ingress ended this request (``_ended`` remembers it)."""
        self._end(key)
        self._release(key, used_tokens)

    def _release(self, key: str, used_tokens: int) -> None:
        """Give the hold back; not remembered as ended: a lease's expiry releases the holds of a
        stalled ingress, which hands the live ones back when it answers again (``adopt``)."""
        res = self._reservations.pop(key, None)
        self._owner.pop(key, None)
        if res is not None:
            self._quotas.settle(res, used_tokens)

    def cancel(self, key: str) -> None:
        res = self._reservations.pop(key, None)
        self._end(key)
        if res is not None:
            self._quotas.cancel(res)

    def _end(self, key: str) -> None:
        self._owner.pop(key, None)
        self._ended[key] = None
        self._ended.move_to_end(key)
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def running(self, tenant_id: str) -> int:
        self.expire_leases()
        return self._quotas.running(tenant_id)

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        self.expire_leases()
        return self._quotas.usage_now(tenant_id)

    def live(self) -> int:
        """Admitted requests not settled yet, over every ingress (a dead ingress's holds leave
        with its lease)."""
        self.expire_leases()
        return len(self._reservations)

    def by_owner(self) -> dict[str, int]:
        """The live reservations counted by the ingress holding them ("": held with no lease)."""
        counts: dict[str, int] = {}
        for key in self._reservations:
            owner = self._owner.get(key, "")
            counts[owner] = counts.get(owner, 0) + 1
        return counts

    # -- leases ----------------------------------------------------------------------------------
    def renew(self, owner: str) -> None:
        if owner:
            self._leases[owner] = time.monotonic()
        self.expire_leases()

    def lapsed(self, owner: str) -> bool:
        """Whether ``owner``'s holds were released while it was silent (told once: it hands its
        live ones back)."""
        was = owner in self._lapsed
        self._lapsed.discard(owner)
        return was

    def live_ingresses(self) -> frozenset[str] | None:
        """The ingress actors Ray holds alive (what a restarted instance waits for)."""
        return self._ingresses.live()

    def leaseholders(self) -> list[str]:
        return sorted(self._leases)

    def expire_leases(self) -> int:
        """Release the holds of every ingress silent for longer than the lease and not alive: gone
        from Ray's list, or not on it by name (``liveness.py``). Settled as serving nothing
        (slot and held tokens back; the request still counts against rpm: it was made). What it
        did deliver is in the usage ledger, recovered as interrupted."""
        now = time.monotonic()
        released = 0
        for owner in [o for o, seen in self._leases.items() if now - seen > self._lease_s]:
            verdict = self._ingresses.verdict(owner)
            if verdict is Verdict.ALIVE:  # Ray holds it: only slow, its holds stay
                self._leases[owner] = now
                continue
            if verdict is Verdict.UNKNOWN:  # the list unreadable for now: keep its holds meanwhile
                continue
            del self._leases[owner]
            if verdict is Verdict.UNNAMED:  # released on the clock alone: it may be stalled, not dead
                self._lapsed.add(owner)
            for key in [k for k, o in self._owner.items() if o == owner]:
                self._release(key, 0)
                released += 1
        self.released_by_lease += released
        return released

    # -- after a restart -------------------------------------------------------------------------
    def adopt(self, held: list[HeldReservation], owner: str = "") -> int:
        """Live reservations an ingress held with the previous instance (or before its lease
        lapsed), re-held here under their keys (no limit checked: they were admitted already).
        Returns how many were new here."""
        self.renew(owner)
        self._lapsed.discard(owner)
        if owner:
            self._reported.add(owner)
        adopted = 0
        for h in held:
            if h.key in self._reservations or h.key in self._ended:
                continue
            # An empty view checks nothing; a budget view re-holds the tokens against the budget.
            view = QuotaView(token_budget=2**62, budget_period=h.budget_period) if h.budget_period else QuotaView()
            self._hold(h.key, self._quotas.reserve(h.tenant_id, view, h.tokens), owner)
            adopted += 1
        self._adopting()  # the last ingress to report ends the wait (admitting_at says when)
        return adopted

    def _adopting(self) -> bool:
        """A restarted instance still waiting for the ingresses' live holds (see the module)."""
        if self._adopted_all:
            return False
        live = self._ingresses.live()
        if live is not None:
            if self._may_hold is None:  # the list was not readable at start: its first reading
                self._may_hold = live
            self._adopted_all = (self._may_hold & live) <= self._reported
        else:
            self._adopted_all = len(self._reported) >= self._expected_ingresses or time.monotonic() > self._settle_until
        if self._adopted_all:
            self.admitting_at = time.time()
        return not self._adopted_all
