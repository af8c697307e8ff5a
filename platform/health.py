"""Readiness: what a load balancer needs to know before sending traffic here."""

from __future__ import annotations

from sqlalchemy import text


def readiness(ctx) -> dict:
    engine = "disabled" if not ctx.gateway.enabled else ("alive" if ctx.gateway.alive else "dead")
    try:
        with ctx.db_engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        database = "reachable"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready; the reason is reported
        database = f"unreachable: {str(exc).splitlines()[0][:200]}"
    ok = engine in ("alive", "disabled") and database == "reachable"
    return {
        "status": "ready" if ok else "not_ready",
        "engine": engine,
        "database": database,
        "usage_spool": ctx.ledger.spool.has_pending(),
        "in_flight": ctx.inflight.count(),
    }
