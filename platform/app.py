"""The HTTP application: admin API (and the tenant API when present) over one PlatformContext."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import SQLAlchemyError

from loraplex.platform.adapters.housekeeping import cleanup_store, sweep_periodically
from loraplex.platform.adapters.vllm_routes import router as vllm_lora_router
from loraplex.platform.admin.router import ADMIN_PREFIX
from loraplex.platform.admin.router import router as admin_router
from loraplex.platform.admin.sso.routes import router as sso_router
from loraplex.platform.auth.admin import ensure_admin_key
from loraplex.platform.auth.gate import AuthGate, KeyPolicy
from loraplex.platform.context import PlatformContext
from loraplex.platform.db import migrate
from loraplex.platform.db.session import is_unreachable, unit_of_work
from loraplex.platform.deps import ContextDep
from loraplex.platform.engine_client import EngineClient, LocalEngineClient
from loraplex.platform.engine_sync import sync_all
from loraplex.platform.errors import NotFound
from loraplex.platform.health import DatabasePending, EngineWatchdog, readiness
from loraplex.platform.http.body_guard import BodyGuard, route_rules
from loraplex.platform.http.context_binding import BindContext
from loraplex.platform.http.error_handlers import install_error_handlers
from loraplex.platform.http.openapi_errors import ADMIN_ERRORS, TENANT_ERRORS
from loraplex.platform.http.request_id import RequestId
from loraplex.platform.http.text_guard import LoneSurrogateGuard
from loraplex.platform.inference.disconnect import DisconnectWatch
from loraplex.platform.inference.responses_api.retention import sweep_periodically as sweep_expired_responses
from loraplex.platform.inference.routes import router as tenant_router
from loraplex.platform.inference.tokenize_routes import router as tokenize_router
from loraplex.platform.pricing.org_routes import router as organization_router
from loraplex.platform.settings import Settings

log = logging.getLogger("loraplex.platform")


def build_context(
    settings: Settings, engine: EngineClient | None = None, *, upgrade_db: bool = True
) -> tuple[PlatformContext, str | None]:
    """Migrate, connect, start (or adopt) the engine, create the first admin key, sync the engine.
    Returns the context and the generated admin key (None if one exists or is configured).

    A database server that cannot be reached at start (PostgreSQL down) does not stop the server:
    it starts degraded (``/ready`` 503, other routes 503 + Retry-After) and a background thread
    finishes the database steps (migrations included) once it answers. A database that answers
    but is unusable (a file that is not a database) raises: the CLI reports it and exits 2."""
    owned = engine is None  # started here: stopped here if the start fails
    engine = engine or LocalEngineClient.start(settings)
    ctx = PlatformContext.build(settings, engine)
    new_admin_key: str | None = None
    try:
        new_admin_key = _prepare_database(ctx, upgrade_db)
    except SQLAlchemyError as exc:
        if not (is_unreachable(exc) and ctx.db_engine.dialect.name != "sqlite"):
            ctx.db_engine.dispose()
            if owned:
                engine.shutdown()
            raise
        log.warning("database unreachable at start; serving degraded until it answers: %s", _first_line(exc))
        ctx.db_ready = False
    ctx.ledger.start()
    ctx.budgets.start()  # settles queued budget holds; and a dead server's, from the ledger
    if ctx.db_ready:
        with unit_of_work(ctx.sessions) as session:
            sync_all(session, ctx.engine, ctx.store.root)
    else:
        threading.Thread(target=_await_database, args=(ctx, upgrade_db), name="loraplex-db-wait", daemon=True).start()
    return ctx, new_admin_key


def _prepare_database(ctx: PlatformContext, upgrade_db: bool) -> str | None:
    if upgrade_db:
        migrate.upgrade(ctx.settings.db_url)
    with unit_of_work(ctx.sessions) as session:
        new_admin_key = ensure_admin_key(session, ctx.hasher, ctx.settings.admin_key)
    ctx.ledger.recover()  # spooled records in, records of a dead run closed as interrupted
    with unit_of_work(ctx.sessions) as session:
        removed = cleanup_store(session, ctx.store)
    if removed:
        log.warning("removed %d leftover upload/orphaned adapter folder(s): %s", len(removed), ", ".join(removed))
    return new_admin_key


def _await_database(ctx: PlatformContext, upgrade_db: bool, interval_s: float = 2.0) -> None:
    """Degraded start: retry the database steps until they succeed, then serve."""
    while True:
        time.sleep(interval_s)
        try:
            admin_key = _prepare_database(ctx, upgrade_db)
            with unit_of_work(ctx.sessions) as session:
                sync_all(session, ctx.engine, ctx.store.root)
        except Exception as exc:  # noqa: BLE001 - still down (or not yet migratable): keep trying
            log.warning("database still unavailable: %s", _first_line(exc))
            continue
        if admin_key:
            log.warning("generated admin key (shown once, store it now): %s", admin_key)
        ctx.db_ready = True
        log.warning("database reachable: serving")
        return


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


@functools.cache
def api_app() -> FastAPI:
    """Every route (admin API, tenant API, health, metrics, the admin page), built once per
    process and shared by every ``create_app``. The routes hold no context: they read the request's
    (``deps.get_context``), which ``BindContext`` puts there. FastAPI builds each route's dependency
    model and validators on the first request an app receives, ~100 ms of CPU for these ~80 routes
    on a 2-core EPYC: shared, a process pays it once instead of once per context (a replica builds
    one; the test suite builds hundreds)."""
    api = FastAPI(
        title="loraplex",
        version="0.1.0",
        description="Multi-LoRA, multi-tenant LLM serving: admin API under /admin/v1.",
    )
    # No error handlers here: a server mounts only this app's router, so what a route raises is
    # answered (and an unexpected error logged) once, by the server's own app (``create_app``).
    api.include_router(admin_router, responses=ADMIN_ERRORS)
    api.include_router(tenant_router, responses=TENANT_ERRORS)
    api.include_router(tokenize_router, responses=TENANT_ERRORS)
    api.include_router(organization_router, responses=TENANT_ERRORS)
    api.include_router(vllm_lora_router, responses=ADMIN_ERRORS)
    api.include_router(sso_router, responses=ADMIN_ERRORS)  # the admin page's sign-in (404 unless sso.enabled)

    @api.get("/metrics", tags=["health"], include_in_schema=False)
    def prometheus_metrics(ctx: ContextDep) -> Response:
        if ctx.observer.metrics is None:
            raise NotFound("metrics are off (observability.metrics)")
        return Response(ctx.observer.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/health", tags=["health"])
    def health(ctx: ContextDep) -> JSONResponse:
        """Liveness: the process answers and its engine loop (if enabled) has not died (503 then:
        the process is about to exit). Use /ready to know whether it can serve."""
        if ctx.engine.enabled and not ctx.engine.alive:
            return JSONResponse({"status": "engine_dead", "engine": True}, status_code=503)
        return JSONResponse({"status": "ok", "engine": ctx.engine.enabled})

    @api.get("/ready", tags=["health"])
    def ready(ctx: ContextDep) -> JSONResponse:
        """Readiness: the engine loop is alive and the database answers (503 otherwise)."""
        body = readiness(ctx)
        return JSONResponse(
            body,
            status_code=200 if body["status"] == "ready" else 503,
            headers=None if body["status"] == "ready" else {"retry-after": "5"},
        )

    _mount_admin_ui(api)
    return api


def create_app(ctx: PlatformContext, *, owns_engine: bool = True, watchdog: EngineWatchdog | None = None) -> FastAPI:
    """The server of one context: the shared routes (``api_app``) behind this context's guards,
    with its background tasks in the lifespan."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        sweeper = asyncio.create_task(sweep_periodically(ctx, ctx.settings.uploads.sweep_interval_s))
        watching = asyncio.create_task(watchdog.run()) if watchdog is not None else None
        expiry = asyncio.create_task(sweep_expired_responses(ctx))
        if ctx.alert_dispatcher is not None:
            ctx.alert_dispatcher.start()  # a thread: delivers the alert outbox (platform/alerts)
        yield
        sweeper.cancel()
        expiry.cancel()
        if watching is not None:
            watching.cancel()
        if owns_engine:
            ctx.engine.shutdown()
        ctx.close()

    api = api_app()
    # /openapi.json and /docs are the API app's own routes (it is mounted at the root)
    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.openapi = api.openapi  # type: ignore[method-assign]  # app.openapi() in code sees the real schema
    install_error_handlers(app)
    # the router, not the app: the API app's own middleware (its error middleware among it) would
    # answer an unexpected error and re-raise it to this app's, which logged it a second time
    app.mount("", api.router)
    _add_request_guards(app, ctx)
    return app


TENANT_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
# Which key each path needs, checked before the body is read (auth/gate.py; test_auth_gate.py
# holds it to every route's own dependencies).
KEY_POLICY = KeyPolicy(
    admin_paths=(ADMIN_PREFIX, "/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
    admin_prefixes=(f"{ADMIN_PREFIX}/",),
    tenant_prefixes=TENANT_PREFIXES,
)


def _add_request_guards(app: FastAPI, ctx: PlatformContext) -> None:
    """ASGI guards, listed innermost first (each ``add_middleware`` wraps the ones before it):
    text validity (reads the body) < body size and time bounds (every route, docs/limits.md) <
    disconnect watch (sees the client's own receive channel) < key check (before any body byte) <
    database pending < request id < the context binding."""
    rules = route_rules(ctx.settings, tenant_prefixes=TENANT_PREFIXES, upload_path=f"{ADMIN_PREFIX}/adapters")
    app.add_middleware(LoneSurrogateGuard, prefixes=(*TENANT_PREFIXES, f"{ADMIN_PREFIX}/"))
    app.add_middleware(BodyGuard, rule_for=rules)
    app.add_middleware(DisconnectWatch, prefixes=("/v1/",))
    app.add_middleware(AuthGate, ctx=ctx, policy=KEY_POLICY)
    app.add_middleware(DatabasePending, ctx=ctx)  # nothing else runs before the DB is ready
    app.add_middleware(RequestId)  # every answer, any guard's refusal too, carries x-request-id
    app.add_middleware(BindContext, ctx=ctx)  # outermost: every layer and route sees this server's context


# The admin web page: static files that talk only to /admin/v1. The CSP keeps any injected markup inert.
_UI_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


def _admin_ui_dir() -> Path | None:
    """The installed ``loraplex.admin_ui`` folder (editable or not), whatever the working directory."""
    try:
        import loraplex.admin_ui as ui
    except ImportError:
        return None
    for entry in getattr(ui, "__path__", []):
        if (Path(entry) / "index.html").is_file():
            return Path(entry)
    return None


def _mount_admin_ui(app: FastAPI) -> None:
    ui_dir = _admin_ui_dir()
    if ui_dir is None:
        log.warning("admin UI files not found; /admin is not served")
        return
    app.mount("/admin/static", StaticFiles(directory=ui_dir / "static"), name="admin-ui-static")

    @app.get("/admin", include_in_schema=False)
    def admin_ui_redirect() -> RedirectResponse:
        return RedirectResponse("admin/", status_code=307)

    @app.get("/admin/", include_in_schema=False)
    def admin_ui_index() -> FileResponse:
        return FileResponse(ui_dir / "index.html", media_type="text/html", headers=_UI_HEADERS)
