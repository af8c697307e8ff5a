"""The budget store of a server: on the platform's database, under the ledger's server identity
(whose lease says when a killed server's holds are to be settled by another), with alert events in
the same outbox as the token quotas' (one is made for a scale-out's ingress, which has none)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loraplex.platform.budgets.alerts import BudgetAlerts
from loraplex.platform.budgets.store import BudgetStore

if TYPE_CHECKING:
    from loraplex.platform.context import PlatformContext


def build_budget_store(ctx: PlatformContext) -> BudgetStore:
    from loraplex.platform.alerts.outbox import Outbox
    from loraplex.platform.db.base import utcnow
    from loraplex.platform.usage.lease import live_instances

    alerts = None
    if ctx.settings.alerts.enabled:
        outbox = ctx.outbox if ctx.outbox is not None else Outbox(ctx.sessions)
        alerts = BudgetAlerts(outbox, tuple(ctx.settings.alerts.thresholds))
    ttl = ctx.settings.ledger.lease_ttl_s
    return BudgetStore(
        ctx.sessions,
        ctx.ledger.instance_id,
        live_instances=lambda session: live_instances(session, ttl_s=ttl, now=utcnow()),
        alerts=alerts,
        sweep_s=max(1.0, ttl / 2),
    )
