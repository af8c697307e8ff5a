"""``loraplex`` command line: serve, db upgrade, and admin helpers that call the same services as
the admin API (so the CLI's changes are audited and reach the engine the same way)."""

from __future__ import annotations

import sys

from loraplex.platform import launch

launch.reexec_for_serve(sys.argv)  # before torch is imported (the imports below pull it in)

import gc  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Annotated, Any  # noqa: E402

import typer  # noqa: E402

from loraplex.platform.settings import ConfigError, Settings, load_settings  # noqa: E402

if TYPE_CHECKING:  # importing the context pulls in the whole platform; serve imports it lazily
    from loraplex.platform.context import PlatformContext

app = typer.Typer(help="loraplex: multi-LoRA, multi-tenant LLM serving", no_args_is_help=True)
db_app = typer.Typer(help="Database schema", no_args_is_help=True)
admin_app = typer.Typer(help="Headless administration (same services as /admin/v1)", no_args_is_help=True)
models_app = typer.Typer(help="Base models", no_args_is_help=True)
demo_app = typer.Typer(help="The embedded demo (SmolLM2-135M-Instruct)", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(admin_app, name="admin")
app.add_typer(models_app, name="models")
app.add_typer(demo_app, name="demo")

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="SQLite file + adapter store")]


def _settings(config: Path | None, data_dir: Path | None = None, **overrides) -> Settings:
    try:
        return load_settings(config, data_dir=data_dir, **overrides)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    config: ConfigOpt = None,
    model: Annotated[str | None, typer.Option(help="Base model directory (default: demo model)")] = None,
    data_dir: DataDirOpt = None,
    host: Annotated[str | None, typer.Option(help="Bind address")] = None,
    port: Annotated[int | None, typer.Option(help="Port")] = None,
    replicas: Annotated[
        int | None, typer.Option(help="Engine replicas; >= 2 runs on Ray Serve (needs loraplex[ray]), 1 = this process")
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Join this Ray cluster instead of starting a local one")
    ] = None,
    chat_template: Annotated[
        str | None, typer.Option(help="Chat template (file or Jinja text) instead of the tokenizer's")
    ] = None,
    tool_call_parser: Annotated[
        str | None, typer.Option(help="How tool calls are read back: hermes, llama3_json, mistral, pythonic")
    ] = None,
) -> None:
    """Migrate the database, start the engine and serve the OpenAI and admin APIs."""
    import uvicorn

    from loraplex.platform.app import create_app
    from loraplex.platform.http.head_deadline import RequestHeadDeadline

    # Flags override the file and the environment, field by field.
    engine = {"model": model} if model is not None else None
    server = {k: v for k, v in (("host", host), ("port", port)) if v is not None} or None
    cluster = {k: v for k, v in (("replicas", replicas), ("ray_address", ray_address)) if v is not None} or None
    openai = {
        k: v for k, v in (("chat_template", chat_template), ("tool_call_parser", tool_call_parser)) if v is not None
    } or None
    settings = _settings(config, data_dir, engine=engine, server=server, cluster=cluster, openai=openai)
    if settings.cluster.replicas > 1 or settings.cluster.max_replicas > 1:  # scale-out or autoscaling
        _check_engine_environment()  # the replicas build their engines in Ray workers: check here first
        _serve_on_ray(settings)
        return
    ctx, admin_key = _build_or_exit(settings)
    if ctx.engine.enabled:
        from loraplex.engine import format_config

        typer.echo("Engine configuration (resolved):")
        typer.echo(format_config(ctx.engine.resolved_config()))
    _show_admin_key(admin_key)
    if settings.environment == "demo" and ctx.db_ready:  # a degraded start has no tenants to show yet
        _print_demo_key(ctx, settings)
    from loraplex.platform.health import ENGINE_DEAD_EXIT_CODE, EngineWatchdog
    from loraplex.platform.http import access_log

    # When the engine loop dies the process ends with a non-zero status (a supervisor restarts it):
    # the watchdog asks uvicorn to stop, and the status is set below, after the shutdown.
    watchdog = EngineWatchdog(
        ctx, lambda: setattr(uv_server, "should_exit", True), grace_s=settings.server.engine_death_grace_s
    )
    app = create_app(ctx, watchdog=watchdog)
    log_config: dict | None = None
    if settings.observability.json_logs:
        from loraplex.platform.observability.requests import configure_json_logs

        configure_json_logs()
        log_config = None  # keep our JSON handler; uvicorn's loggers propagate to it
    kwargs: dict[str, Any] = {} if not settings.observability.json_logs else {"log_config": log_config}
    uv_config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level="info",
        timeout_keep_alive=max(1, int(settings.limits.idle_timeout_s)),  # an idle socket is closed
        # a socket that sends nothing, or stalls inside its headers, is closed too
        http=RequestHeadDeadline.with_timeout(settings.limits.header_timeout_s, settings.limits.max_header_bytes),
        **kwargs,
    )
    uv_server = uvicorn.Server(uv_config)  # config.load() (in run) configures logging; the filter goes after
    uv_config.load()
    access_log.install()
    # Everything built so far (torch, transformers, the model, the app) lives as long as the process:
    # move it out of the cyclic GC's reach, so a full collection never walks millions of long-lived
    # objects while the event loop and the engine thread wait (a stop-the-world pause of 100+ ms).
    gc.collect()
    gc.freeze()
    uv_server.run()
    if watchdog.failure is not None:
        typer.echo(
            f"error: the engine died ({watchdog.failure}); exiting with status {ENGINE_DEAD_EXIT_CODE}", err=True
        )
        raise typer.Exit(ENGINE_DEAD_EXIT_CODE)


def _check_engine_environment() -> None:
    """The engine's environment overrides, or one error line and exit 2 (as ``_build_or_exit``)."""
    from loraplex.engine import EngineConfigError, check_cpu_overrides

    try:
        check_cpu_overrides()
    except EngineConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _build_or_exit(settings: Settings):
    """build_context, or one line naming the database and exit 2 when it answers but cannot be used
    (a file that is not a database, a schema newer than this version...); unreachable is degraded."""
    from sqlalchemy.exc import SQLAlchemyError

    from loraplex.engine import EngineConfigError
    from loraplex.platform.app import build_context

    try:
        return build_context(settings)
    except EngineConfigError as exc:  # e.g. an environment override naming an unknown CPU kind
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except SQLAlchemyError as exc:
        reason = (str(getattr(exc, "orig", None) or exc).splitlines() or ["unusable"])[0][:200]
        where = settings.db_url.split("///", 1)[1] if settings.db_url.startswith("sqlite") else _safe_url(settings)
        typer.echo(f"error: the database {where} cannot be used: {reason}", err=True)
        raise typer.Exit(2) from None


def _safe_url(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    return make_url(settings.db_url).render_as_string(hide_password=True)


def _show_admin_key(admin_key: str | None) -> None:
    if admin_key:
        typer.echo("=" * 72)
        typer.echo("Generated admin key (shown once, store it now; only its hash is kept):")
        typer.echo(f"  {admin_key}")
        typer.echo("=" * 72)


def _serve_on_ray(settings: Settings) -> None:
    from loraplex.platform.cluster import deploy

    if not deploy.ray_serve_installed():
        typer.echo("error: --replicas > 1 runs on Ray Serve: pip install 'loraplex[ray]'", err=True)
        raise typer.Exit(2)

    _show_admin_key(deploy.prepare_once(settings))
    deploy.run(settings)


def _print_demo_key(ctx: PlatformContext, settings: Settings) -> None:
    from loraplex.platform.demo.bootstrap import DEMO_TENANT, demo_snippets, ensure_demo_tenant

    demo_key = ensure_demo_tenant(ctx)
    if demo_key is None:
        return
    host = settings.server.host
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    base_url = f"http://{host}:{settings.server.port}"
    typer.echo(f"Demo tenant {DEMO_TENANT!r} created; its API key (shown once):")
    typer.echo(f"  {demo_key}")
    typer.echo("Try it:")
    typer.echo(demo_snippets(base_url, demo_key, ctx.engine.model_name or "MODEL"))
    typer.echo("=" * 72)


@models_app.command("pull-demo")
def models_pull_demo(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Convert the packaged SmolLM2-135M-Instruct GGUF into the data dir now (serve does it on
    first start otherwise); prints the checkpoint's path."""
    from loraplex.engine import DemoModelUnavailable, ensure_demo_checkpoint
    from loraplex.platform.engine_client import demo_model_dir

    settings = _settings(config, data_dir)
    try:
        typer.echo(ensure_demo_checkpoint(demo_model_dir(settings)))
    except DemoModelUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@demo_app.command("adapters")
def demo_adapters(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Optimizer steps per adapter (default: its recipe)")] = None,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Train and register only this adapter (repeatable)")
    ] = None,
) -> None:
    """Train the demo adapters (french, pirate, tools) with peft on this machine and register each
    for the demo tenant as soon as it is trained. A rerun skips adapters already trained with the
    same recipe and data (and resumes one stopped mid-training). A running server loads them on its
    next start."""
    from loraplex.platform.demo.adapters import register_for_demo_tenant, train_demo_adapters
    from loraplex.platform.demo.bootstrap import ensure_demo_tenant
    from loraplex.platform.demo.dataset import ADAPTERS

    unknown = sorted(set(only or []) - set(ADAPTERS))
    if unknown:
        typer.echo(f"error: unknown demo adapter(s) {unknown}; choose from {sorted(ADAPTERS)}", err=True)
        raise typer.Exit(2)
    ctx = _admin_ctx(config, data_dir, with_engine=True)
    new_key = ensure_demo_tenant(ctx)
    if new_key:
        typer.echo(f"demo tenant created; its API key (shown once): {new_key}")

    def register(name: str, folder: Path) -> None:
        with _cli_errors():
            for row in register_for_demo_tenant(ctx, {name: folder}, skip_registered=True):
                state = "already registered" if row.get("already_registered") else "registered"
                typer.echo(f"[loraplex] demo adapter {name!r} {state}: {json.dumps(row)}")

    train_demo_adapters(
        ctx.engine.model_dir,
        ctx.settings.data_dir / "demo-adapters",
        typer.echo,
        names=only or None,
        steps=steps,
        on_trained=register,
    )


@db_app.command("upgrade")
def db_upgrade(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    revision: Annotated[str, typer.Option(help="Target revision")] = "head",
) -> None:
    """Apply Alembic migrations (SQLite file or LORAPLEX_DATABASE_URL)."""
    from loraplex.platform.db import migrate

    settings = _settings(config, data_dir)
    migrate.upgrade(settings.db_url, revision)
    typer.echo(f"database at revision {revision}")


def _admin_ctx(config: Path | None, data_dir: Path | None, with_engine: bool = False):
    from loraplex.platform.context import PlatformContext
    from loraplex.platform.db import migrate
    from loraplex.platform.engine_client import LocalEngineClient

    settings = _settings(config, data_dir)
    migrate.upgrade(settings.db_url)
    engine = LocalEngineClient.disabled()
    if with_engine:
        engine = LocalEngineClient.validator_only(settings)
    return PlatformContext.build(settings, engine)


def _print(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


@admin_app.command("create-tenant")
def create_tenant(
    name: str,
    priority: int = 0,
    weight: float = 1.0,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create a tenant; prints it as JSON."""
    from loraplex.platform.auth.admin import CLI_ACTOR
    from loraplex.platform.db.session import unit_of_work
    from loraplex.platform.tenants import service
    from loraplex.platform.tenants.schemas import TenantCreate, TenantOut

    body = _validated(TenantCreate, name=name, priority=priority, weight=weight)
    ctx = _admin_ctx(config, data_dir)
    with _cli_errors(), unit_of_work(ctx.sessions) as session:
        tenant = service.create_tenant(session, ctx, CLI_ACTOR, **body.model_dump())
        _print(TenantOut.model_validate(tenant).model_dump(mode="json"))


@admin_app.command("create-key")
def create_key(
    tenant: Annotated[str, typer.Argument(help="Tenant id or name")],
    name: str = "",
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create an API key for a tenant; prints the key once."""
    from loraplex.platform.auth.admin import CLI_ACTOR
    from loraplex.platform.db.session import unit_of_work
    from loraplex.platform.keys import service

    ctx = _admin_ctx(config, data_dir)
    with _cli_errors(), unit_of_work(ctx.sessions) as session:
        tenant_id = _tenant_id(session, tenant)
        key, secret = service.create_key(session, ctx, CLI_ACTOR, tenant_id, name, None)
        _print({"id": key.id, "tenant_id": tenant_id, "prefix": key.prefix, "key": secret})


@admin_app.command("upload-adapter")
def upload_adapter(
    name: str,
    archive: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help=".zip or .tar.gz")],
    tenant: Annotated[str | None, typer.Option(help="Owning tenant id or name (private)")] = None,
    shared: Annotated[bool, typer.Option(help="Usable by every tenant")] = False,
    new_version: bool = False,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Validate and store an adapter archive. A running server loads it on its next start; use the
    admin API to register it with a running engine at once."""
    from loraplex.platform.adapters import service
    from loraplex.platform.adapters.schemas import AdapterOut
    from loraplex.platform.auth.admin import CLI_ACTOR
    from loraplex.platform.db.session import unit_of_work

    ctx = _admin_ctx(config, data_dir, with_engine=True)
    with _cli_errors(), unit_of_work(ctx.sessions) as session, open(archive, "rb") as f:
        tenant_id = _tenant_id(session, tenant) if tenant else None
        req = service.UploadRequest(name, "shared" if shared else "private", tenant_id, new_version)
        adapter = service.upload_adapter(session, ctx, CLI_ACTOR, req, f)
        _print(AdapterOut.model_validate(adapter).model_dump(mode="json"))


@admin_app.command("register-adapter")
def register_adapter(
    name: str,
    source: Annotated[str, typer.Argument(help="s3://bucket/prefix/, file:///abs/path or hf://org/repo[@rev]")],
    tenant: Annotated[str | None, typer.Option(help="Owning tenant id or name (private)")] = None,
    shared: Annotated[bool, typer.Option(help="Usable by every tenant")] = False,
    new_version: bool = False,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Register an adapter by reference: its files are fetched and validated now, and every engine
    fetches them on first use (a running server serves it at the first request naming it)."""
    from loraplex.platform.adapters import references, service
    from loraplex.platform.adapters.schemas import AdapterOut
    from loraplex.platform.auth.admin import CLI_ACTOR
    from loraplex.platform.db.session import unit_of_work

    ctx = _admin_ctx(config, data_dir, with_engine=True)
    with _cli_errors(), unit_of_work(ctx.sessions) as session:
        tenant_id = _tenant_id(session, tenant) if tenant else None
        req = service.UploadRequest(name, "shared" if shared else "private", tenant_id, new_version)
        adapter = references.register_reference(session, ctx, CLI_ACTOR, req, source)
        _print(AdapterOut.model_validate(adapter).model_dump(mode="json"))
    ctx.close()


@admin_app.command("rotate-admin-key")
def rotate_admin_key(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Replace the generated admin key (e.g. the printed one was lost); prints the new key once."""
    from loraplex.platform.auth.admin import rotate_admin_key as rotate
    from loraplex.platform.db.session import unit_of_work

    ctx = _admin_ctx(config, data_dir)
    with unit_of_work(ctx.sessions) as session:
        typer.echo(rotate(session, ctx.hasher))


@admin_app.command("revoke-sso-sessions")
def revoke_sso_sessions(email: str, config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Sign a person out of the admin page everywhere now (their SSO sessions; docs/sso.md)."""
    from loraplex.platform.admin.sso.sessions import revoke_all_for

    ctx = _admin_ctx(config, data_dir)
    typer.echo(f"revoked {revoke_all_for(ctx, email)} session(s) of {email}")


def _tenant_id(session, ref: str) -> str:
    from loraplex.platform.errors import NotFound
    from loraplex.platform.tenants import repository

    tenant = repository.get(session, ref) or repository.get_by_name(session, ref)
    if tenant is None:
        raise NotFound(f"no tenant with id or name {ref!r}")
    return tenant.id


def _validated(model, **values):
    from pydantic import ValidationError

    try:
        return model(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        typer.echo(f"error: {'.'.join(map(str, err['loc']))}: {err['msg']}", err=True)
        raise typer.Exit(2) from None


class _cli_errors:
    """Platform errors become one line on stderr and exit code 1."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, _tb):
        from loraplex.platform.errors import PlatformError

        if exc is not None and isinstance(exc, PlatformError):
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(1)
        return False


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
