"""Budget admission by reservation, exact across every server on one database.

``reserve`` holds each engine request's worst-case cost (``costs.worst_case``) against every budget
that applies (its key, its project, its tenant) in ONE transaction that first locks those budget
rows, in a fixed order: an ``UPDATE`` of each row, which is a row lock on PostgreSQL and the file's
write lock on SQLite. So concurrent admissions, on one server or many (the replicas of a scale-out
share the database), queue on the row and each sees the others' holds: the sum of what is spent
and held never passes the amount. The holds are rows (``BudgetHold``), written in that transaction.

``settle`` (the request ended) and ``release`` (refused or failed before serving) are queued to a
worker thread — the request path never waits on them — which, per request, locks the budget rows,
deletes its holds and moves each hold from ``reserved_units`` to the actual cost in
``spent_units``. Deleting the hold row is the "once": a second settle finds nothing to delete.
A hold admitted in an earlier window (the period rolled meanwhile) only disappears: its cost
belongs to the window it was admitted in, which is over.

A server killed with holds in flight: its lease (``usage.lease``) expires, and another server's
worker (every ``lease_ttl_s``, and at start) settles the dead server's holds from the usage ledger
— the tokens the request's record holds (checkpointed, closed as interrupted), or nothing if it has
no record (it never served a byte: records are durable before the first one)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from loraplex.platform.alerts.events import AlertEvent
from loraplex.platform.budgets import alerts as budget_alerts
from loraplex.platform.budgets.amounts import micros_to_units
from loraplex.platform.budgets.costs import Priced, actual_cost, price_for, worst_case
from loraplex.platform.budgets.models import Budget, BudgetHold
from loraplex.platform.budgets.periods import window_end, window_start
from loraplex.platform.errors import RateLimited, ServiceUnavailable
from loraplex.platform.pricing.money import cost_text

log = logging.getLogger("loraplex.platform.budgets")

RETRY_S = 1.0  # a settle the database refused (outage) is tried again this often


class BudgetExceeded(RateLimited):
    """OpenAI's answer for a spent balance: 429 with type and code ``insufficient_quota``."""

    type = "insufficient_quota"
    code = "insufficient_quota"


@dataclass(frozen=True)
class Cost:
    """One engine request to hold: its id and token counts (prompt, n x max_tokens)."""

    request_id: str
    prompt_tokens: int
    max_output_tokens: int


@dataclass
class Ticket:
    """An admitted engine request's holds (one per budget); settled or released exactly once."""

    request_id: str
    amount_units: int
    done: bool = False


@dataclass
class _Settle:
    request_id: str
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    attempts: int = field(default=0)


def pk_in(scopes: list[tuple[str, str]]):
    return or_(*(and_(Budget.scope == s, Budget.scope_id == i) for s, i in scopes))


class BudgetStore:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        instance_id: str,
        *,
        live_instances: Callable[[Session], list[str]],
        alerts: budget_alerts.BudgetAlerts | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        sweep_s: float = 15.0,
    ) -> None:
        self._sessions = sessions
        self.instance_id = instance_id
        self._live_instances = live_instances
        self._alerts = alerts
        self.clock = clock  # injectable: tests move time across period boundaries without sleeping
        self._sweep_s = sweep_s
        self._queue: queue.Queue[_Settle | None] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stopping = False

    # -- admission -------------------------------------------------------------------------------
    def reserve(
        self, scopes: list[tuple[str, str]], costs: list[Cost], adapter_name: str | None, base_model: str | None
    ) -> list[Ticket] | None:
        """Hold every request's worst-case cost against every budget of ``scopes``, all or none.
        None: no budget applies (nothing to settle). Blocking (database): call it from a thread."""
        scopes = sorted(set(scopes))
        now = self.clock()
        try:
            with self._sessions() as session:  # a plain read first: no write lock for the unbudgeted
                present = sorted(session.execute(select(Budget.scope, Budget.scope_id).where(pk_in(scopes))).all())
                if not present:
                    return None
                priced = price_for(session, adapter_name, base_model, now)
            self.start()
            return self._reserve_locked([(s, i) for s, i in present], costs, priced, now)
        except SQLAlchemyError as exc:
            # Money is not admitted on a guess: without the database no budget can be checked.
            log.warning("budget admission unavailable: %s", str(exc).splitlines()[0][:200] if str(exc) else exc)
            raise ServiceUnavailable(
                "the budget of this request cannot be checked right now", headers={"retry-after": "5"}
            ) from None

    def _reserve_locked(
        self, scopes: list[tuple[str, str]], costs: list[Cost], priced: Priced, now: datetime
    ) -> list[Ticket]:
        amounts = [worst_case(priced.rate, c.prompt_tokens, c.max_output_tokens) for c in costs]
        need = sum(amounts)
        what = "this request" if len(costs) == 1 else f"these {len(costs)} prompts"
        events: list[AlertEvent] = []
        refusal: BudgetExceeded | None = None
        with self._sessions() as session:
            for scope, sid in scopes:  # lock in a fixed order (row lock / SQLite's write lock)
                session.execute(
                    update(Budget)
                    .where(Budget.scope == scope, Budget.scope_id == sid)
                    .values(amount_micros=Budget.amount_micros)
                )
            rows = list(session.scalars(select(Budget).where(pk_in(scopes)).order_by(Budget.scope, Budget.scope_id)))
            for b in rows:
                roll(b, now)
                limit = micros_to_units(b.amount_micros)
                end = window_end(b.period, b.timezone, b.window_start)
                if priced.currency is not None and priced.currency != b.currency:
                    refusal = _refused(
                        b,
                        f"the {b.scope}'s budget is in {b.currency} but this model is priced in "
                        f"{priced.currency}; set the budget again in {priced.currency}",
                        end,
                        now,
                    )
                    break
                used = b.spent_units + b.reserved_units
                if used + max(need, 1) > limit:  # a free (unpriced) request too, once nothing is left
                    left = max(0, limit - used)
                    refusal = _refused(
                        b,
                        f"budget exceeded: the {b.scope}'s budget is {cost_text(limit)} {b.currency} per "
                        f"{_period_word(b.period)}; {cost_text(left)} left, {what} may cost up to "
                        f"{cost_text(need)} (prompt tokens at the input price + n x max_tokens at the output "
                        "price); lower max_tokens or n, or raise the budget",
                        end,
                        now,
                    )
                    if self._alerts is not None:
                        events.append(self._alerts.refusal(b, used + need))
                    break
                b.reserved_units += need
                b.updated_at = now
                if self._alerts is not None:
                    events.extend(self._alerts.crossings(b, b.spent_units + b.reserved_units))
            if refusal is not None:
                session.rollback()  # the roll of a window too: the next admission redoes it
                if events and self._alerts is not None:
                    self._alerts.emitter.emit(events)  # one refusal event per window (deduplicated)
                raise refusal
            for b in rows:
                session.add_all(
                    BudgetHold(
                        request_id=c.request_id,
                        scope=b.scope,
                        scope_id=b.scope_id,
                        window_start=b.window_start,
                        amount_units=amount,
                        input_micros_per_mtok=priced.rate.input if priced.rate else 0,
                        cached_input_micros_per_mtok=priced.rate.cached_input if priced.rate else 0,
                        output_micros_per_mtok=priced.rate.output if priced.rate else 0,
                        instance_id=self.instance_id,
                        created_at=now,
                    )
                    for c, amount in zip(costs, amounts)
                )
            if events and self._alerts is not None:
                self._alerts.emitter.in_transaction(session, events)  # durable with the holds, or neither
            session.commit()
        if events and self._alerts is not None:
            self._alerts.emitter.committed(events)
        return [Ticket(c.request_id, amount) for c, amount in zip(costs, amounts)]

    # -- the end of a request --------------------------------------------------------------------
    def settle(self, ticket: Ticket | None, prompt: int, cached: int, completion: int) -> None:
        """The request ended having used these tokens: charge their cost (at the admission's price),
        give the rest of the hold back. Never blocks; applied by the worker in order."""
        if ticket is None or ticket.done:
            return
        ticket.done = True
        self._enqueue(_Settle(ticket.request_id, prompt, cached, completion))

    def release(self, ticket: Ticket | None) -> None:
        """The request was refused or failed before serving anything: the whole hold comes back."""
        self.settle(ticket, 0, 0, 0)

    def _enqueue(self, item: _Settle) -> None:
        self.start()
        with self._idle:
            self._pending += 1
        self._queue.put(item)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued settle is applied (tests, admin views, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def settle_now(self, request_id: str, prompt: int, cached: int, completion: int) -> int:
        """Apply one settle in this thread: lock the budgets its holds are on, delete the holds, move
        each from reserved to the actual cost. Returns how many holds it settled (0: already done)."""
        with self._sessions() as session:
            holds = list(session.scalars(select(BudgetHold).where(BudgetHold.request_id == request_id)))
            if not holds:
                return 0
            scopes = sorted({(h.scope, h.scope_id) for h in holds})
            session.rollback()  # end the read before taking the write lock (SQLite: no upgrade)
            for scope, sid in scopes:
                session.execute(
                    update(Budget)
                    .where(Budget.scope == scope, Budget.scope_id == sid)
                    .values(amount_micros=Budget.amount_micros)
                )
            budgets = {(b.scope, b.scope_id): b for b in session.scalars(select(Budget).where(pk_in(scopes)))}
            settled = 0
            for h in session.scalars(
                select(BudgetHold).where(BudgetHold.request_id == request_id).order_by(BudgetHold.scope)
            ).all():
                gone = session.execute(
                    delete(BudgetHold).where(
                        BudgetHold.request_id == h.request_id,
                        BudgetHold.scope == h.scope,
                        BudgetHold.scope_id == h.scope_id,
                    )
                )
                if not getattr(gone, "rowcount", 0):
                    continue  # settled meanwhile (a recovery and a late settle): applied once
                settled += 1
                b = budgets.get((h.scope, h.scope_id))
                if b is None or b.window_start != h.window_start:
                    continue  # the budget was removed, or its window rolled: nothing to move
                cost = min(actual_cost(h, prompt, cached, completion), h.amount_units)
                b.reserved_units = max(0, b.reserved_units - h.amount_units)
                b.spent_units += cost  # thresholds counted the hold at admission: a settle only lowers
            session.commit()
            return settled

    # -- a dead server's holds -------------------------------------------------------------------
    def recover_dead(self) -> int:
        """Settle the holds of servers whose lease expired, from their requests' usage records."""
        from loraplex.platform.usage.models import UsageRecord

        with self._sessions() as session:
            live = [*self._live_instances(session), self.instance_id]
            orphans = list(
                session.scalars(
                    select(BudgetHold.request_id).where(BudgetHold.instance_id.not_in(live)).distinct().limit(500)
                )
            )
            records = {
                r.request_id: r for r in session.scalars(select(UsageRecord).where(UsageRecord.request_id.in_(orphans)))
            }
        done = 0
        for rid in orphans:
            r = records.get(rid)
            if r is None:
                done += self.settle_now(rid, 0, 0, 0)
            else:
                done += self.settle_now(rid, r.prompt_tokens, r.cached_tokens, r.completion_tokens)
        if done:
            log.warning("settled %d budget holds of a server that stopped", done)
        return done

    # -- the worker ------------------------------------------------------------------------------
    def start(self) -> BudgetStore:
        with self._start_lock:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="loraplex-budgets", daemon=True)
                self._thread.start()
        return self

    def close(self) -> None:
        self.flush(10.0)
        with self._start_lock:
            self._stopping = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(10)

    def _run(self) -> None:
        next_sweep = 0.0
        while True:
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self._sweep_s
                try:
                    self.recover_dead()
                except SQLAlchemyError as exc:
                    log.debug("budget recovery postponed: %s", exc)
            try:
                item = self._queue.get(timeout=max(0.05, next_sweep - time.monotonic()))
            except queue.Empty:
                continue
            if item is None:
                return
            try:
                self.settle_now(item.request_id, item.prompt, item.cached, item.completion)
            except SQLAlchemyError as exc:  # the database is down: keep it, try again (in order)
                item.attempts += 1
                if item.attempts == 1:
                    log.warning("budget settle postponed: %s", str(exc).splitlines()[0][:200] if str(exc) else exc)
                time.sleep(RETRY_S)
                self._queue.put(item)
                continue
            except Exception:  # noqa: BLE001 - a bug must not stop every later settle
                log.exception("budget settle failed for %s", item.request_id)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()


def roll(b: Budget, now: datetime) -> bool:
    """Start a new window if the period turned (in the budget's timezone): nothing spent or held in
    it yet (holds of the old window settle into nothing)."""
    start = window_start(b.period, b.timezone, now)
    if b.window_start == start:
        return False
    b.window_start, b.spent_units, b.reserved_units = start, 0, 0
    return True


def _period_word(period: str) -> str:
    return {"daily": "day", "weekly": "week", "monthly": "month"}.get(period, "all time (it never resets)")


def _refused(b: Budget, message: str, end: datetime | None, now: datetime) -> BudgetExceeded:
    # Until the period ends (the official clients do not wait that long: no automatic retry); a
    # "total" budget never ends, and the clients' own header says not to retry it at all.
    if end is None:
        return BudgetExceeded(message, headers={"x-should-retry": "false"})
    return BudgetExceeded(message, headers={"retry-after": str(max(1, int((end - now).total_seconds()) + 1))})
