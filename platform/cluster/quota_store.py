"""``QuotaStore`` backed by the control-plane actor: the same four calls as the in-process store,
exact across every ingress replica (the actor serialises them).

Calls ride out an actor restart (``actor_calls``). The store remembers its live reservations, so
when the actor comes back as a new instance (a new epoch) it hands them back (``adopt``): the
requests still running keep their concurrency slot and their tokens in the window.

No request thread waits in ``ray.get``: ``reserve`` (called from the admission's worker thread)
hands its call to this store's own event loop (``ActorLoop``) and waits on a plain future; the
loop gathers the reserves that arrive while its previous call is in flight into ONE
``reserve_many`` call, so a burst of 40 admissions costs the actor a handful of calls and a busy
machine no thread storm. Keys are chosen here, so a call sent again after a lost answer is
answered with the same hold, never a second one. A tenant with no limit at all is not waited
for (``_reserve_unlimited``): nothing could refuse it, so the control plane's restart does not
stall its requests. ``precheck`` (the cheap refusal before
tokenizing) answers from this ingress's memory of the tenant's last refusal, for at most
``REFUSAL_MEMORY_S``, instead of asking the actor; ``reserve`` checks every limit atomically there
anyway.

The store names its ingress (``owner``): the actor holds its reservations on a lease that the
ingress's calls renew, and releases them if the ingress dies (``control.py``)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loraplex.platform.cluster.actor_calls import RETRY_BUDGET_S, ActorLoop, call_actor, call_actor_async
from loraplex.platform.cluster.messages import HeldReservation, Hold, Refusal, ReserveAnswer, ReserveItem, Retry
from loraplex.platform.errors import ServiceUnavailable
from loraplex.platform.quotas.store import QuotaView, Reservation

REFUSAL_MEMORY_S = 0.5  # a slot freed on another ingress is seen at most this late
RETRY_PAUSE_S = 0.1  # between resends of holds a restarted control plane asked to send again


@dataclass
class ActorReservation(Reservation):
    key: str = ""  # the actor keeps the real reservation; this names it
    period: str | None = None  # the budget period it holds tokens against (None: no budget)


class ActorQuotaStore:
    """``actor``: the control plane's Ray handle (``ControlPlane`` methods, called ``.remote``)."""

    def __init__(self, actor: Any, owner: str = "", *, retry_budget_s: float = RETRY_BUDGET_S) -> None:
        self._actor = actor
        self._owner = owner
        # how long a reserve waits for an admit or a refusal (a restarting control plane answers
        # Retry until the ingresses have handed their holds back) before it is a 503
        self._retry_budget_s = retry_budget_s
        self._calls = ActorLoop("loraplex-quota-calls")
        self._queue: list[tuple[ReserveItem, asyncio.Future[ReserveAnswer]]] = []
        self._sending = False  # a reserve_many is in flight (only the loop's thread reads this)
        self._lock = threading.Lock()
        self._live: dict[str, ActorReservation] = {}
        self._epoch: str | None = None
        self._refused: dict[str, tuple[float, Refusal]] = {}  # tenant -> (until, refusal)

    def precheck(self, tenant_id: str, quota: QuotaView) -> None:
        with self._lock:
            remembered = self._refused.get(tenant_id)
        if remembered is not None and time.monotonic() < remembered[0]:
            raise remembered[1].error()

    def _remember(self, tenant_id: str, refusal: Refusal) -> None:
        with self._lock:
            self._refused[tenant_id] = (time.monotonic() + REFUSAL_MEMORY_S, refusal)
            if len(self._refused) > 10_000:  # bounded: drop the expired ones
                now = time.monotonic()
                self._refused = {t: v for t, v in self._refused.items() if v[0] > now}

    def reserve(self, tenant_id: str, quota: QuotaView, tokens: int) -> Reservation:
        key = uuid.uuid4().hex
        if quota.unlimited:
            return self._reserve_unlimited(tenant_id, quota, tokens, key)
        try:
            got = self._calls.run(
                self._reserve(ReserveItem(key, tenant_id, quota, tokens)), timeout=self._retry_budget_s + 10
            )
        except BaseException:
            self._actor.cancel.remote(key)  # sent after the reserve: undoes it if it lands after all
            raise
        if isinstance(got, Refusal):
            self._remember(tenant_id, got)
            raise got.error()
        period = quota.budget_period if quota.token_budget is not None else None
        res = ActorReservation(tenant_id, got.tokens, got.headers, got.admitted_at, key=got.key, period=period)
        with self._lock:
            self._live[res.key] = res
        self.saw_epoch(got.epoch)
        return res

    def count_request(self, tenant_id: str, quota: QuotaView) -> None:
        """Counted by the actor (exact across ingresses): a hold of no tokens, settled at once."""
        if quota.rpm is None:
            return
        self.settle(self.reserve(tenant_id, QuotaView(rpm=quota.rpm), 0), 0)

    def _reserve_unlimited(self, tenant_id: str, quota: QuotaView, tokens: int, key: str) -> Reservation:
        """A view with no limit cannot be refused: the hold is sent and not waited for. The actor
        still records it (the running counts, what a drain waits for), and this call is submitted
        before the request's settle or cancel, so the actor sees them in that order (one caller's
        calls run in submission order, on a restarted instance too). So such a tenant's requests
        are served while the control plane restarts; its live holds are adopted like any other."""
        self._actor.reserve_many.remote(self._owner, [ReserveItem(key, tenant_id, quota, tokens)])
        res = ActorReservation(tenant_id, tokens, {}, time.monotonic(), key=key, period=None)
        with self._lock:
            self._live[key] = res
        return res

    async def _reserve(self, item: ReserveItem) -> Hold | Refusal:
        """Queue one reserve; the first in an idle moment starts the sender (on the store's loop)."""
        answer: asyncio.Future[ReserveAnswer] = asyncio.get_running_loop().create_future()
        self._queue.append((item, answer))
        if not self._sending:
            self._sending = True
            asyncio.ensure_future(self._send())
        try:  # bounded: a restarted instance may keep asking for a resend while an ingress is frozen
            got = await asyncio.wait_for(answer, timeout=self._retry_budget_s)
        except asyncio.TimeoutError:
            raise ServiceUnavailable(
                f"the quota coordinator did not admit or refuse in {self._retry_budget_s:.0f} s",
                headers={"retry-after": "5"},
            ) from None
        assert not isinstance(got, Retry)  # the sender sends a Retry again, never answers it
        return got

    async def _send(self) -> None:
        """One ``reserve_many`` at a time, each carrying every reserve queued meanwhile."""
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                items = [item for item, _ in batch]
                try:
                    answers: list[ReserveAnswer] = await _await_actor(
                        functools.partial(self._actor.reserve_many.remote, self._owner, items),
                        what="the quota coordinator",
                        budget_s=self._retry_budget_s,  # a restart is ridden out within the store's own budget
                    )
                except Exception as exc:  # noqa: BLE001 - each waiting caller gets the error
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                again = []
                for (item, fut), got in zip(batch, answers):
                    if isinstance(got, Retry):  # a restarted instance still collecting the live holds
                        self.saw_epoch(got.epoch)  # ours among them: sent before the retry
                        if not fut.done():  # (its caller may have given up: no resend then)
                            again.append((item, fut))
                    elif not fut.done():
                        fut.set_result(got)
                if again:
                    self._queue = again + self._queue
                    await asyncio.sleep(RETRY_PAUSE_S)
        finally:
            self._sending = False

    # settle/cancel run on the event loop at a request's end: fire and forget (an actor executes
    # one caller's calls in submission order, so a later reserve sees this release; Ray retries
    # them on a restarted instance, where an unknown key is a no-op).
    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        if self._forget(reservation):
            self._actor.settle.remote(_key(reservation), used_tokens)
        if reservation.linked is not None:  # an API key's own hold (platform/auth/key_scopes.py)
            self.settle(reservation.linked, used_tokens)

    def cancel(self, reservation: Reservation) -> None:
        if self._forget(reservation):
            self._actor.cancel.remote(_key(reservation))
        if reservation.linked is not None:
            self.cancel(reservation.linked)

    def running(self, tenant_id: str) -> int:
        return int(call_actor(lambda: self._actor.running.remote(tenant_id)))  # type: ignore[call-overload]

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        return dict(call_actor(lambda: self._actor.usage_now.remote(tenant_id)))  # type: ignore[call-overload]

    # -- healing -------------------------------------------------------------------------------
    def saw_epoch(self, epoch: str, readopt: bool = False) -> None:
        """The actor instance that answered. A new one (restarted), or the same one that let this
        ingress's lease lapse (``readopt``), gets this store's live reservations back; calls from
        one caller run in order, so a settle sent after this adopt finds its key there, and one
        sent before it was not adopted (already forgotten)."""
        with self._lock:
            if self._epoch == epoch and not readopt:
                return
            self._epoch = epoch
            held = [HeldReservation(r.key, r.tenant_id, r.tokens, r.period) for r in self._live.values()]
            # sent even when empty: a restarted instance counts the ingresses that reported before
            # it admits new limited holds (control.py); at a first start it is a no-op
            self._actor.adopt.remote(held, self._owner)

    def live_count(self) -> int:
        with self._lock:
            return len(self._live)

    def _forget(self, reservation: Reservation) -> bool:
        with self._lock:
            if reservation.done:
                return False
            reservation.done = True
            self._live.pop(_key(reservation), None)
            return True


async def _await_actor(submit: Callable[[], Any], what: str, budget_s: float) -> Any:  # a test without Ray replaces it
    return await call_actor_async(submit, what=what, budget_s=budget_s)


def _key(reservation: Reservation) -> str:
    return reservation.key if isinstance(reservation, ActorReservation) else ""
