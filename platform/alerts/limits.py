"""Which alert events a limit check produces: the quota store calls this (and budgets in currency
will), so the rules "each threshold once per window" and "one refusal event per window, not per
refused request" live in one place; the outbox's unique dedupe key enforces them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from loraplex.platform.alerts.events import AlertEmitter, AlertEvent, AlertKind

MINUTE = timedelta(seconds=60)


def minute_window(now: datetime) -> tuple[datetime, datetime]:
    """The window of a per-minute limit's alerts: the clock minute (a sliding window has none)."""
    start = now.replace(second=0, microsecond=0)
    return start, start + MINUTE


def subject(scope: str) -> tuple[str, str | None, str | None, str | None]:
    """(kind, tenant_id, key_id, project_id) from a quota scope: a tenant's scope is its id, a key's
    ``key:<id>``, a project's ``project:<id>`` (their tenant is looked up when the event is stored)."""
    if scope.startswith("key:"):
        return "key", None, scope[len("key:") :], None
    if scope.startswith("project:"):
        return "project", None, None, scope[len("project:") :]
    return "tenant", scope, None, None


@dataclass(frozen=True)
class LimitAlerts:
    emitter: AlertEmitter
    thresholds: tuple[int, ...] = (50, 80, 100)

    def crossings(
        self, scope: str, rule: str, unit: str, limit: int, used: int, window: tuple[datetime, datetime]
    ) -> list[AlertEvent]:
        """Every threshold ``used`` has reached (not just the ones this request crossed: an event
        whose transaction failed is then written by the next request; the dedupe key keeps one)."""
        kind, tenant_id, key_id, project_id = subject(scope)
        return [
            AlertEvent(AlertKind.THRESHOLD, kind, tenant_id, key_id, rule, unit, limit, used, *window, pct, project_id)
            for pct in self.thresholds
            if used * 100 >= pct * limit
        ]

    def refusal(
        self, scope: str, rule: str, unit: str, limit: int, used: int, window: tuple[datetime, datetime]
    ) -> AlertEvent:
        kind, tenant_id, key_id, project_id = subject(scope)
        return AlertEvent(
            AlertKind.REFUSED, kind, tenant_id, key_id, rule, unit, limit, used, *window, None, project_id
        )
