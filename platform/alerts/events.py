"""What an alert is, independent of what raised it: an event kind, the limit it is about, and the
window it belongs to. Token quotas emit these today; budgets in currency will emit the same kinds
(``rule="budget"``, ``unit="USD"``), so a receiver written now keeps working.

``dedupe_key`` is the "once per window" rule: the outbox has a unique index on it, so however many
requests (on however many servers) cross a threshold together, one event is stored."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol


class AlertKind(StrEnum):
    # usage (reserved + consumed) reached ``threshold_percent`` of a limit in its window
    THRESHOLD = "limit.threshold"
    # a request was refused (429) by a limit; one event per window, not per refused request
    REFUSED = "limit.refused"


@dataclass(frozen=True)
class AlertEvent:
    kind: AlertKind
    scope: str  # "tenant", "key" or "project"
    tenant_id: str | None
    key_id: str | None
    rule: str  # token_budget | tpm | rpm | max_concurrent | budget
    unit: str  # tokens | requests | a currency (budgets)
    limit: int
    used: int  # what the limit counted when the event happened (this request included)
    window_start: datetime
    window_end: datetime
    threshold_percent: int | None = None
    project_id: str | None = None  # scope "project"

    @property
    def subject(self) -> str:
        if self.scope == "project":
            return f"project:{self.project_id}"
        return f"key:{self.key_id}" if self.scope == "key" else f"tenant:{self.tenant_id}"

    @property
    def dedupe_key(self) -> str:
        pct = "" if self.threshold_percent is None else f":{self.threshold_percent}"
        return f"{self.kind}:{self.subject}:{self.rule}:{self.window_start.isoformat()}{pct}"

    def data(self) -> dict:
        """The ``data`` object of the delivered body (docs/alerts.md)."""
        return {
            "scope": self.scope,
            "tenant_id": self.tenant_id,
            "key_id": self.key_id,
            "rule": self.rule,
            "unit": self.unit,
            "limit": self.limit,
            "used": self.used,
            "threshold_percent": self.threshold_percent,
            "window": {"start": self.window_start.isoformat(), "end": self.window_end.isoformat()},
            **({"project_id": self.project_id} if self.scope == "project" else {}),
        }


def body_of(event_id: str, kind: str, created_at: datetime, data: dict) -> str:
    """The exact bytes every delivery of an event carries (signed; stable across retries)."""
    doc = {"id": event_id, "type": kind, "created_at": created_at.isoformat(), "data": data}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class AlertEmitter(Protocol):
    """What the quota code (and later the budget code) calls. ``in_transaction`` adds the events to
    the caller's open transaction (the one that records the consumption or refusal); the caller's
    commit makes both durable or neither, and then it calls ``committed``. ``emit`` is for a
    refusal decided without a transaction (a per-server limit): the event row is then the whole
    record, written in a transaction of its own."""

    def pending(self, events: list[AlertEvent]) -> list[AlertEvent]:
        """The events not already known to be stored (a cache: skips a write per request)."""

    def in_transaction(self, session, events: list[AlertEvent]) -> None: ...

    def committed(self, events: list[AlertEvent]) -> None: ...

    def emit(self, events: list[AlertEvent]) -> None: ...
