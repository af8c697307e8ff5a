"""Readiness: what a load balancer needs to know before sending traffic here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text

from loraplex.platform.http_errors import error_response

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext

# Answered while the database is not ready yet (a degraded start): liveness, readiness, metrics.
_ALWAYS = ("/health", "/ready", "/metrics")


def readiness(ctx: PlatformContext) -> dict:
    engine = "disabled" if not ctx.gateway.enabled else ("alive" if ctx.gateway.alive else "dead")
    try:
        with ctx.db_engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        database = "reachable"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready; the reason is reported
        database = f"unreachable: {str(exc).splitlines()[0][:200]}"
    if database == "reachable" and not getattr(ctx, "db_ready", True):
        database = "starting: migrations and recovery not done yet"
    ok = engine in ("alive", "disabled") and database == "reachable"
    return {
        "status": "ready" if ok else "not_ready",
        "engine": engine,
        "database": database,
        "usage_spool": ctx.ledger.spool.has_pending(),
        "in_flight": ctx.inflight.count(),
    }


class DatabasePending:
    """ASGI guard for a degraded start: until the database steps ran (it was unreachable at start),
    every route but health answers 503 + Retry-After instead of failing on a missing schema."""

    def __init__(self, app, ctx: PlatformContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.ctx.db_ready or scope["path"] in _ALWAYS:
            return await self.app(scope, receive, send)
        response = error_response(
            503,
            "the database is not available yet; retry shortly",
            code="database_unavailable",
            headers={"retry-after": "5"},
        )
        await response(scope, receive, send)
