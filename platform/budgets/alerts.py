"""Budget alert events: the same kinds as token quotas (``limit.threshold`` at the soft thresholds,
``limit.refused`` once per window), ``rule="budget"``, ``unit`` the currency, ``limit`` and
``used`` in micro-units (millionths) of it, the window the budget's period in its timezone. The
outbox's unique dedupe key keeps one event per threshold (and one refusal) per window."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from loraplex.platform.alerts.events import AlertEmitter, AlertEvent, AlertKind
from loraplex.platform.budgets.amounts import micros_to_units, units_to_micros_ceil
from loraplex.platform.budgets.models import Budget
from loraplex.platform.budgets.periods import window_end

NEVER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)  # a "total" budget's window end
RULE = "budget"


@dataclass(frozen=True)
class BudgetAlerts:
    emitter: AlertEmitter
    thresholds: tuple[int, ...] = (50, 80, 100)

    def crossings(self, b: Budget, used_units: int) -> list[AlertEvent]:
        """Every threshold reached by spent + held (the dedupe key keeps one event of each)."""
        limit = micros_to_units(b.amount_micros)
        return [
            self._event(AlertKind.THRESHOLD, b, used_units, pct)
            for pct in self.thresholds
            if used_units * 100 >= pct * limit
        ]

    def refusal(self, b: Budget, used_units: int) -> AlertEvent:
        return self._event(AlertKind.REFUSED, b, used_units, None)

    @staticmethod
    def _event(kind: AlertKind, b: Budget, used_units: int, pct: int | None) -> AlertEvent:
        end = window_end(b.period, b.timezone, b.window_start) or NEVER
        return AlertEvent(
            kind,
            b.scope,
            b.tenant_id,
            b.scope_id if b.scope == "key" else None,
            RULE,
            b.currency,
            b.amount_micros,
            units_to_micros_ceil(used_units),
            b.window_start,
            end,
            pct,
            project_id=b.scope_id if b.scope == "project" else None,
        )
