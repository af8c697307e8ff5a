"""In-process quota admission: requests and tokens per minute (sliding windows), concurrency, and a
token budget per day or month. A refusal is a 429 with Retry-After and x-ratelimit-* headers."""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from loraplex.platform.errors import RateLimited

WINDOW_S = 60.0


@dataclass
class QuotaView:
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    token_budget: int | None = None
    budget_period: str = "month"


@dataclass
class _TenantState:
    requests: deque = field(default_factory=deque)  # admission times
    tokens: deque = field(default_factory=deque)  # (time, tokens)
    running: int = 0
    period_start: datetime | None = None
    budget_used: int = 0


def period_start(period: str, now: datetime) -> datetime:
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


class Ticket:
    """An admitted request; ``finish`` returns its concurrency slot and books its tokens."""

    def __init__(self, limiter: "QuotaLimiter", tenant_id: str, headers: dict[str, str]) -> None:
        self._limiter = limiter
        self.tenant_id = tenant_id
        self.headers = headers
        self._done = False

    def finish(self, tokens: int) -> None:
        if not self._done:
            self._done = True
            self._limiter._finish(self.tenant_id, tokens)


class QuotaLimiter:
    def __init__(self, budget_used_since: Callable[[str, datetime], int], clock=time.monotonic) -> None:
        self._budget_used_since = budget_used_since  # tokens already in the usage table
        self._clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantState] = {}

    def admit(self, tenant_id: str, quota: QuotaView, prompt_tokens: int) -> Ticket:
        now = self._clock()
        wall = datetime.now(timezone.utc)
        start = period_start(quota.budget_period, wall) if quota.token_budget else None
        if start is not None:
            used = self._budget_used_since(tenant_id, start)  # outside the lock: a DB query
        with self._lock:
            st = self._tenants.setdefault(tenant_id, _TenantState())
            _trim(st, now)
            tokens_in_window = sum(n for _, n in st.tokens)
            headers = _headers(quota, st, tokens_in_window, now)
            if quota.max_concurrent is not None and st.running >= quota.max_concurrent:
                raise _limited(f"too many concurrent requests (max_concurrent={quota.max_concurrent})", 1, headers)
            if quota.rpm is not None and len(st.requests) >= quota.rpm:
                wait = st.requests[0] + WINDOW_S - now
                raise _limited(f"rate limit reached: {quota.rpm} requests per minute", wait, headers)
            if quota.tpm is not None and tokens_in_window + prompt_tokens > quota.tpm:
                wait = st.tokens[0][0] + WINDOW_S - now if st.tokens else WINDOW_S
                raise _limited(f"rate limit reached: {quota.tpm} tokens per minute", wait, headers)
            if start is not None:
                if st.period_start != start:
                    st.period_start, st.budget_used = start, used
                st.budget_used = max(st.budget_used, used)
                if st.budget_used + prompt_tokens > quota.token_budget:
                    reset = _next_period(quota.budget_period, start)
                    raise _limited(
                        f"token budget exhausted: {quota.token_budget} tokens per {quota.budget_period}",
                        (reset - wall).total_seconds(), headers, code="insufficient_quota")
            st.requests.append(now)
            st.running += 1
            return Ticket(self, tenant_id, _headers(quota, st, tokens_in_window, now))

    def usage_now(self, tenant_id: str) -> dict[str, int]:
        """This tenant's sliding-minute requests and tokens and its running requests."""
        with self._lock:
            st = self._tenants.get(tenant_id)
            if st is None:
                return {"requests_last_minute": 0, "tokens_last_minute": 0, "running": 0}
            _trim(st, self._clock())
            return {"requests_last_minute": len(st.requests), "tokens_last_minute": sum(n for _, n in st.tokens),
                    "running": st.running}

    def _finish(self, tenant_id: str, tokens: int) -> None:
        with self._lock:
            st = self._tenants.setdefault(tenant_id, _TenantState())
            st.running = max(0, st.running - 1)
            if tokens:
                st.tokens.append((self._clock(), tokens))
                st.budget_used += tokens

    def running(self, tenant_id: str) -> int:
        with self._lock:
            st = self._tenants.get(tenant_id)
            return st.running if st else 0


def _trim(st: _TenantState, now: float) -> None:
    while st.requests and st.requests[0] <= now - WINDOW_S:
        st.requests.popleft()
    while st.tokens and st.tokens[0][0] <= now - WINDOW_S:
        st.tokens.popleft()


def _headers(q: QuotaView, st: _TenantState, tokens: int, now: float) -> dict[str, str]:
    h: dict[str, str] = {}
    if q.rpm is not None:
        reset = (st.requests[0] + WINDOW_S - now) if st.requests else 0.0
        h["x-ratelimit-limit-requests"] = str(q.rpm)
        h["x-ratelimit-remaining-requests"] = str(max(0, q.rpm - len(st.requests)))
        h["x-ratelimit-reset-requests"] = f"{max(0.0, reset):.1f}s"
    if q.tpm is not None:
        reset = (st.tokens[0][0] + WINDOW_S - now) if st.tokens else 0.0
        h["x-ratelimit-limit-tokens"] = str(q.tpm)
        h["x-ratelimit-remaining-tokens"] = str(max(0, q.tpm - tokens))
        h["x-ratelimit-reset-tokens"] = f"{max(0.0, reset):.1f}s"
    return h


def _limited(message: str, wait_s: float, headers: dict[str, str], code: str = "rate_limit_exceeded") -> RateLimited:
    return RateLimited(message, code=code, headers={**headers, "retry-after": str(max(1, math.ceil(wait_s)))})


def _next_period(period: str, start: datetime) -> datetime:
    if period == "day":
        from datetime import timedelta

        return start + timedelta(days=1)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
