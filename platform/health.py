"""Readiness: what a load balancer needs to know before sending traffic here; and the watchdog
that ends the process when its engine dies, so that a supervisor starts a fresh one."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import text

from loraplex.platform.http.error_handlers import error_response

if TYPE_CHECKING:  # the context is built above every service; only its type is needed here
    from loraplex.platform.context import PlatformContext

log = logging.getLogger("loraplex.platform")

# Answered while the database is not ready yet (a degraded start): liveness, readiness, metrics.
_ALWAYS = ("/health", "/ready", "/metrics")
# The exit status of a server whose engine died (sysexits' EX_SOFTWARE): non-zero, so systemd's
# Restart=on-failure, Docker's restart policies and Kubernetes restart it; distinct from a bad
# configuration (2) and from a signal (128 + n), so the logs say which it was.
ENGINE_DEAD_EXIT_CODE = 70


class EngineWatchdog:
    """Ends the process when the engine loop dies. A dead engine cannot come back in this process
    (its thread is gone, its state may be corrupt), and a server that stays up answering 503 is
    only restarted by a supervisor that probes ``/ready``: so the watchdog, polling the engine,
    waits ``grace_s`` (``/ready`` and ``/health`` answer 503 meanwhile; the engine has already
    failed every stream with an error event) and then asks the server to stop (``request_exit``:
    uvicorn's graceful shutdown); ``serve`` then exits with ``ENGINE_DEAD_EXIT_CODE``. If the
    shutdown has not ended the process ``hard_exit_s`` later, it exits anyway (``os._exit``)."""

    def __init__(
        self,
        ctx: PlatformContext,
        request_exit: Callable[[], None],
        *,
        interval_s: float = 0.5,
        grace_s: float = 2.0,
        hard_exit_s: float = 30.0,
    ) -> None:
        self.ctx = ctx
        self.request_exit = request_exit
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.hard_exit_s = hard_exit_s
        self.failure: str | None = None  # why the engine died, once it did

    def engine_dead(self) -> bool:
        return bool(self.ctx.engine.enabled and not self.ctx.engine.alive)

    async def run(self) -> None:
        while not self.engine_dead():
            await asyncio.sleep(self.interval_s)
        self.failure = getattr(self.ctx.engine, "failure", None) or "the engine thread is gone"
        log.critical(
            "engine died (%s): /ready answers 503; the process exits with status %d in %.0f s so that its "
            "supervisor restarts it",
            self.failure,
            ENGINE_DEAD_EXIT_CODE,
            self.grace_s,
        )
        await asyncio.sleep(self.grace_s)
        threading.Thread(target=self._hard_exit, name="loraplex-exit-deadline", daemon=True).start()
        self.request_exit()

    def _hard_exit(self) -> None:
        threading.Event().wait(self.hard_exit_s)
        log.critical("shutdown after the engine died took over %.0f s: exiting now", self.hard_exit_s)
        logging.shutdown()
        os._exit(ENGINE_DEAD_EXIT_CODE)


def readiness(ctx: PlatformContext) -> dict:
    engine = "disabled" if not ctx.engine.enabled else ("alive" if ctx.engine.alive else "dead")
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
