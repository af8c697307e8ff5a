"""Quota admission by reservation: requests and tokens per minute (sliding windows), concurrency and
a token budget per day or month.

Admission *reserves* ``prompt + n x max_tokens`` (``rule.request_cost``) against tpm and the budget, atomically with the rpm and
concurrency checks; the finish *settles* the reservation to the tokens actually served and returns
the rest. So N concurrent requests can never be promised more than the limit, whatever they
generate. A refusal is a 429 with Retry-After and x-ratelimit-* headers.

``QuotaStore`` is the seam: ``InProcessQuotaStore`` is exact within one server process. Servers
on one database (side by side, or a restart within the minute) also count each other through the
usage ledger (``shared``: what every other instance admitted in the last minute and the budget
period, read at each reservation of a limited tenant under a per-tenant database lock, and this
admission's hold written before the lock is released), so the rpm, tpm and budget limits hold
across them exactly (docs/billing.md). ``max_concurrent`` stays per server.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Protocol

from loraplex.platform.alerts.events import AlertEvent
from loraplex.platform.alerts.limits import LimitAlerts, minute_window
from loraplex.platform.errors import RateLimited
from loraplex.platform.quotas.group import never_fits
from loraplex.platform.quotas.rule import RULE

WINDOW_S = 60.0


@dataclass(frozen=True)
class QuotaView:
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    token_budget: int | None = None
    budget_period: str = "month"

    @property
    def unlimited(self) -> bool:
        """No limit at all: nothing could refuse a request under this view."""
        return self.rpm is None and self.tpm is None and self.max_concurrent is None and self.token_budget is None


@dataclass(frozen=True)
class Others:
    """What other servers admitted for a tenant (from the ledger): requests and tokens in the last
    minute, and tokens in the current budget period."""

    requests: int = 0
    tokens: int = 0
    budget: int = 0


NO_OTHERS = Others()


@dataclass
class Reservation:
    """An admitted request's hold on its tenant's quota; settle or cancel it exactly once."""

    tenant_id: str
    tokens: int  # reserved: rule.request_cost (prompt + n x max_tokens)
    headers: dict[str, str]
    admitted_at: float
    budget_period: datetime | None = None
    _window_entry: list | None = None  # [time, tokens] in the tpm window
    done: bool = False
    # A second hold released with this one (an API key's own limits: platform/auth/key_scopes.py).
    linked: Reservation | None = None
    # The engine request's id: a shared window (platform/quotas/shared.py) writes the hold under it.
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    held_in_db: bool = False


class SharedWindow(Protocol):
    """Admission made atomic across the servers on one database (``quotas/shared.py``)."""

    def window(self, tenant_id: str, period_start: datetime | None) -> AbstractContextManager[SharedAdmission]: ...

    def drop(self, request_id: str) -> None: ...


class SharedAdmission(Protocol):
    others: Others
    held: bool  # after the window closed: the hold is in the database
    alerts: list[AlertEvent]  # written in the window's transaction, refused or admitted
    alerts_written: bool  # after the window closed: they are in the database

    def hold(self, request_id: str, tokens: int) -> None: ...


class QuotaStore(Protocol):
    def precheck(self, tenant_id: str, quota: QuotaView) -> None:
        """Cheap refusals before any tokenizing: concurrency and rpm (consumes nothing)."""

    def reserve(self, tenant_id: str, quota: QuotaView, tokens: int) -> Reservation:
        """Atomically check every limit and hold ``tokens`` plus one request and one slot."""
        # Optional: ``reserve_group(tenant_id, quota, tokens: list[int]) -> list[Reservation]``, the
        # same for several engine requests at once (a prompt list), all or none. ``group.reserve_all``
        # uses it where a store has it and drives a store without it one reservation at a time.

    def count_request(self, tenant_id: str, quota: QuotaView) -> None:
        """A request that generates nothing (a lookup, tokenizing, a stored response): one request
        in the rpm window, refused (429) at ``quota.rpm``; no tokens, no slot, nothing to settle."""

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        """The request ended: book what it used, return the rest of the hold and its slot."""

    def cancel(self, reservation: Reservation) -> None:
        """The request was refused after reserving: undo everything, the rpm slot too."""

    def running(self, tenant_id: str) -> int: ...

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        """Sliding-minute requests and tokens (reserved or settled) and running requests (admin view)."""


@dataclass
class _TenantState:
    requests: deque = field(default_factory=deque)  # admission times (rpm window)
    tokens: deque = field(default_factory=deque)  # [time, tokens] entries (tpm window)
    running: int = 0
    period_start: datetime | None = None
    budget_used: int = 0  # settled tokens in the current period
    budget_reserved: int = 0  # held by running requests


def period_start(period: str, now: datetime) -> datetime:
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_period(period: str, start: datetime) -> datetime:
    if period == "day":
        return start + timedelta(days=1)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)


class InProcessQuotaStore:
    """Exact for one process: one lock around every tenant's counters."""

    def __init__(
        self,
        budget_used_since: Callable[[str, datetime], int],
        clock=time.monotonic,
        wall=lambda: datetime.now(timezone.utc),
        shared: SharedWindow | None = None,
        alerts: LimitAlerts | None = None,
    ) -> None:
        # Threshold and refusal events (platform/alerts): written in the admission's transaction.
        self._alerts = alerts
        # Tokens already in the ledger for a period, read once per tenant and period (a DB query);
        # unused with ``shared``, which reads the other servers' share at every reservation.
        self._budget_used_since = budget_used_since
        # Servers on one database: the others' usage is read and this admission's hold written
        # under one per-tenant lock, so two servers cannot both pass a limit at the same moment.
        self._shared = shared
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantState] = {}

    def precheck(self, tenant_id: str, quota: QuotaView) -> None:
        now = self._clock()
        try:
            with self._lock:
                st = self._tenants.setdefault(tenant_id, _TenantState())
                _trim(st, now)
                self._check_slots(st, quota, now)
        except RateLimited as exc:
            self._refused_alone(tenant_id, quota, exc)
            raise

    def count_request(self, tenant_id: str, quota: QuotaView) -> None:
        # This server's window only: such requests write no ledger row, so servers sharing a
        # database count each other's generation requests but not these (docs/openai-api.md).
        if quota.rpm is None:
            return  # nothing could refuse it: not recorded (an unlimited flood grows no deque)
        now = self._clock()
        try:
            with self._lock:
                st = self._tenants.setdefault(tenant_id, _TenantState())
                _trim(st, now)
                self._check_slots(st, QuotaView(rpm=quota.rpm), now)
                st.requests.append(now)
        except RateLimited as exc:
            self._refused_alone(tenant_id, quota, exc)
            raise

    def _refused_alone(self, scope: str, quota: QuotaView, exc: RateLimited) -> None:
        """A refusal by a per-server check (no database transaction): its event row is the record."""
        events: list[AlertEvent] = []
        self._note_refusal(scope, quota, exc, self._wall(), None, events)
        self._emit(events)

    def reserve(self, tenant_id: str, quota: QuotaView, tokens: int) -> Reservation:
        return self.reserve_group(tenant_id, quota, [tokens])[0]

    def reserve_group(self, tenant_id: str, quota: QuotaView, tokens: list[int]) -> list[Reservation]:
        """All of ``tokens`` (one engine request each: a prompt list) or none, in one step: every
        limit is checked for the whole group under one lock (and one shared window), so concurrent
        lists never hold part of a limit each and starve one another. A group that can never fit
        these limits is a 400 (``group.never_fits``), not a 429 to retry forever."""
        if len(tokens) > 1:
            never_fits(tenant_id, quota, tokens)
        wall = self._wall()
        start = period_start(quota.budget_period, wall) if quota.token_budget is not None else None
        limited = quota.rpm is not None or quota.tpm is not None or quota.token_budget is not None
        events: list[AlertEvent] = []
        if self._shared is None or not limited:
            try:
                return self._alerting(tenant_id, quota, wall, start, events, self._reserve, tokens, NO_OTHERS)
            finally:
                self._emit(events)
        win = None
        try:
            with self._shared.window(tenant_id, start) as win:  # a refusal raises: nothing is held
                try:
                    held = self._alerting(tenant_id, quota, wall, start, events, self._reserve, tokens, win.others)
                finally:
                    # written in the window's transaction, with the holds (or, refused, alone)
                    win.alerts.extend(events)
                for res in held:
                    win.hold(res.request_id, res.tokens)
        finally:
            if events and not (win is not None and win.alerts_written):
                self._emit(events)  # no database transaction took them (a key's scope, database down)
        for res in held:
            res.held_in_db = win.held  # False if the database failed: this server's counters decided
        return held

    def _alerting(
        self,
        scope: str,
        quota: QuotaView,
        wall: datetime,
        start: datetime | None,
        events: list[AlertEvent],
        reserve: Callable[..., list[Reservation]],
        tokens: list[int],
        ext: Others,
    ) -> list[Reservation]:
        """Run ``reserve``; a refusal adds its ``limit.refused`` event to ``events`` (once per window:
        the clock minute for per-minute limits, the budget period for the token budget)."""
        try:
            return reserve(scope, quota, tokens, wall, start, ext, events)
        except RateLimited as exc:
            self._note_refusal(scope, quota, exc, wall, start, events)
            raise

    def _note_refusal(
        self,
        scope: str,
        quota: QuotaView,
        exc: RateLimited,
        wall: datetime,
        start: datetime | None,
        events: list[AlertEvent],
    ) -> None:
        rule = getattr(exc, "limit_rule", None)
        if self._alerts is None or rule is None:
            return
        name, limit, used = rule
        if name == "token_budget" and start is not None:
            window = (start, next_period(quota.budget_period, start))
        else:
            window = minute_window(wall)
        unit = "tokens" if name in ("tpm", "token_budget") else "requests"
        events.append(self._alerts.refusal(scope, name, unit, limit, used, window))

    def _emit(self, events: list[AlertEvent]) -> None:
        if events and self._alerts is not None:
            self._alerts.emitter.emit(events)

    def _reserve(
        self,
        tenant_id: str,
        quota: QuotaView,
        group: list[int],
        wall: datetime,
        start: datetime | None,
        ext: Others,
        events: list[AlertEvent],
    ) -> list[Reservation]:
        now = self._clock()
        tokens = sum(group)
        count = len(group)
        what = "this request" if count == 1 else f"these {count} prompts"
        used_before: int | None = None
        if start is not None and self._shared is not None:
            used_before = 0  # this process's own share starts at zero: the rest is in ``ext.budget``
        elif start is not None:
            with self._lock:
                st = self._tenants.get(tenant_id)
                known = st is not None and st.period_start == start
            if not known:
                used_before = self._budget_used_since(tenant_id, start)  # outside the lock
        with self._lock:
            st = self._tenants.setdefault(tenant_id, _TenantState())
            _trim(st, now)
            if start is not None and st.period_start != start and used_before is not None:
                st.period_start, st.budget_used = start, used_before
            in_window = sum(e[1] for e in st.tokens) + ext.tokens
            headers = _headers(quota, st, in_window, now, ext.requests)
            self._check_slots(st, quota, now, headers, ext.requests, count)
            if quota.tpm is not None:
                if tokens > quota.tpm:
                    raise _limited(
                        f"{what} needs {tokens} tokens ({RULE}), more than the "
                        f"limit of {quota.tpm} tokens per minute; lower max_tokens or n",
                        WINDOW_S,
                        headers,
                        rule=("tpm", quota.tpm, in_window + tokens),
                    )
                if in_window + tokens > quota.tpm:
                    wait = st.tokens[0][0] + WINDOW_S - now if st.tokens else WINDOW_S
                    raise _limited(
                        f"rate limit reached: {quota.tpm} tokens per minute ({what} reserves {tokens}: {RULE})",
                        wait,
                        headers,
                        rule=("tpm", quota.tpm, in_window + tokens),
                    )
            if start is not None and quota.token_budget is not None:
                spent = ext.budget + st.budget_used + st.budget_reserved
                if spent + tokens > quota.token_budget:
                    left = max(0, quota.token_budget - spent)
                    raise _limited(
                        f"token budget exhausted: {quota.token_budget} tokens per {quota.budget_period}; "
                        f"{left} left, {what} reserves {tokens} ({RULE})",
                        (next_period(quota.budget_period, start) - wall).total_seconds(),
                        headers,
                        code="insufficient_quota",
                        rule=("token_budget", quota.token_budget, spent + tokens),
                    )
                st.budget_reserved += tokens
                if self._alerts is not None:
                    used = spent + tokens
                    window = (start, next_period(quota.budget_period, start))
                    events.extend(
                        self._alerts.crossings(tenant_id, "token_budget", "tokens", quota.token_budget, used, window)
                    )
            entries = []
            for t in group:
                entries.append([now, t])
                st.tokens.append(entries[-1])
                st.requests.append(now)
                st.running += 1
            headers = _headers(quota, st, in_window + tokens, now, ext.requests)
            return [Reservation(tenant_id, e[1], dict(headers), now, start, e) for e in entries]

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        with self._lock:
            st = self._tenants.get(tenant_id)
            if st is None:
                return {"requests_last_minute": 0, "tokens_last_minute": 0, "running": 0}
            _trim(st, self._clock())
            return {
                "requests_last_minute": len(st.requests),
                "tokens_last_minute": sum(e[1] for e in st.tokens),
                "running": st.running,
            }

    def settle(self, reservation: Reservation, used_tokens: int) -> None:
        self._release(reservation, used_tokens, refund_request=False)
        if reservation.linked is not None:
            self.settle(reservation.linked, used_tokens)

    def cancel(self, reservation: Reservation) -> None:
        first = not reservation.done
        self._release(reservation, 0, refund_request=True)
        if first and reservation.held_in_db and self._shared is not None:
            self._shared.drop(reservation.request_id)  # the others stop counting it
        if reservation.linked is not None:
            self.cancel(reservation.linked)

    def running(self, tenant_id: str) -> int:
        with self._lock:
            st = self._tenants.get(tenant_id)
            return st.running if st else 0

    def _release(self, res: Reservation, used: int, *, refund_request: bool) -> None:
        with self._lock:
            if res.done:
                return
            res.done = True
            st = self._tenants.setdefault(res.tenant_id, _TenantState())
            st.running = max(0, st.running - 1)
            if res._window_entry is not None:
                res._window_entry[1] = used  # the window now holds what was served
            if res.budget_period is not None and st.period_start == res.budget_period:
                st.budget_reserved = max(0, st.budget_reserved - res.tokens)
                st.budget_used += used
            if refund_request:
                try:
                    st.requests.remove(res.admitted_at)
                except ValueError:  # already out of the window
                    pass

    @staticmethod
    def _check_slots(
        st: _TenantState,
        quota: QuotaView,
        now: float,
        headers: dict | None = None,
        other_requests: int = 0,
        count: int = 1,
    ) -> None:
        headers = headers if headers is not None else _headers(quota, st, sum(e[1] for e in st.tokens), now)
        if quota.max_concurrent is not None and st.running + count > quota.max_concurrent:
            raise _limited(
                f"too many concurrent requests (max_concurrent={quota.max_concurrent})",
                1,
                headers,
                rule=("max_concurrent", quota.max_concurrent, st.running + count),
            )
        if quota.rpm is not None and len(st.requests) + other_requests + count > quota.rpm:
            wait = st.requests[0] + WINDOW_S - now if st.requests else 1.0
            raise _limited(
                f"rate limit reached: {quota.rpm} requests per minute",
                wait,
                headers,
                rule=("rpm", quota.rpm, len(st.requests) + other_requests + count),
            )


def _trim(st: _TenantState, now: float) -> None:
    while st.requests and st.requests[0] <= now - WINDOW_S:
        st.requests.popleft()
    while st.tokens and st.tokens[0][0] <= now - WINDOW_S:
        st.tokens.popleft()


def _headers(q: QuotaView, st: _TenantState, tokens: int, now: float, other_requests: int = 0) -> dict[str, str]:
    h: dict[str, str] = {}
    if q.rpm is not None:
        reset = (st.requests[0] + WINDOW_S - now) if st.requests else 0.0
        h["x-ratelimit-limit-requests"] = str(q.rpm)
        h["x-ratelimit-remaining-requests"] = str(max(0, q.rpm - len(st.requests) - other_requests))
        h["x-ratelimit-reset-requests"] = f"{max(0.0, reset):.1f}s"
    if q.tpm is not None:
        reset = (st.tokens[0][0] + WINDOW_S - now) if st.tokens else 0.0
        h["x-ratelimit-limit-tokens"] = str(q.tpm)
        h["x-ratelimit-remaining-tokens"] = str(max(0, q.tpm - tokens))
        h["x-ratelimit-reset-tokens"] = f"{max(0.0, reset):.1f}s"
    return h


def _limited(
    message: str,
    wait_s: float,
    headers: dict[str, str],
    code: str = "rate_limit_exceeded",
    *,
    rule: tuple[str, int, int],
) -> RateLimited:
    exc = RateLimited(message, code=code, headers={**headers, "retry-after": str(max(1, math.ceil(wait_s)))})
    exc.limit_rule = rule  # type: ignore[attr-defined]  # (rule, limit, used): the refusal's alert
    return exc
