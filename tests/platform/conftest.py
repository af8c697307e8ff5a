"""Platform test fixtures: one real engine per session (demo model), a fresh database per test on
SQLite and, when LORAPLEX_TEST_POSTGRES_URL is set, on PostgreSQL too."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import httpx
import openai
import pytest
from alerts_helpers import Receiver, alert_settings
from fastapi.testclient import TestClient
from harness import postgres
from harness.live import LiveServer
from harness.serve import ServeProcess
from platform_helpers import (
    ADMIN_KEY,
    BACKENDS,
    adapter_files,
    admin_headers,
    make_peft_adapter,
    make_settings,
    need_postgres,
    pg_create_database,
    pg_drop_database,
    zip_bytes,
)
from sqlalchemy.engine import make_url

from loraplex.platform.app import build_context, create_app
from loraplex.platform.db import migrate
from loraplex.platform.engine_client import LocalEngineClient
from loraplex.platform.settings import load_settings


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "loraplex.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_template():
    url = pg_create_database()
    migrate.upgrade(url)
    yield make_url(url).database
    pg_drop_database(url)


def _fresh_database(request, folder: Path):
    """A migrated, empty database of the backend ``request.param`` (a copy of the template)."""
    if request.param == "sqlite":
        target = folder / "db" / "loraplex.db"
        target.parent.mkdir()
        shutil.copy(request.getfixturevalue("sqlite_template"), target)
        yield f"sqlite:///{target}"
        return
    need_postgres()
    url = pg_create_database(template=request.getfixturevalue("pg_template"))
    yield url
    pg_drop_database(url)


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path):
    """A migrated, empty database of each backend."""
    yield from _fresh_database(request, tmp_path)


@pytest.fixture(scope="module", params=BACKENDS)
def module_db_url(request, tmp_path_factory):
    """``db_url`` shared by the tests of one module (for ``module_tenant_setup``)."""
    yield from _fresh_database(request, tmp_path_factory.mktemp("module-db"))


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory) -> Path:
    from loraplex.engine.demo_model import ensure_demo_model

    return Path(ensure_demo_model(tmp_path_factory.mktemp("models") / "demo"))


@pytest.fixture(scope="session")
def demo_engine(demo_model_dir, tmp_path_factory):
    """The real engine on the demo model, shared by every test of the session."""
    settings = load_settings(
        data_dir=tmp_path_factory.mktemp("engine-data"),
        engine={
            "model": str(demo_model_dir),
            "dtype": "float32",  # HF oracles (logprobs) compare in fp32; auto would pick bf16 on this CPU
            "max_num_seqs": 8,
            "max_loras": 4,
            "max_lora_rank": 16,
            "kv_cache_memory_gb": 0.05,
        },
    )
    gw = LocalEngineClient.start(settings)
    yield gw
    gw.shutdown()


class Platform:
    """A running app on its own database, with the session's engine."""

    def __init__(self, ctx, client: TestClient) -> None:
        self.ctx = ctx
        self.client = client

    @property
    def store_root(self) -> Path:
        return self.ctx.store.root


@pytest.fixture
def platform(tmp_path, db_url, demo_engine):
    settings = make_settings(tmp_path, db_url)
    ctx, _ = build_context(settings, demo_engine, upgrade_db=False)
    app = create_app(ctx, owns_engine=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Platform(ctx, client)


@pytest.fixture
def client(platform) -> TestClient:
    return platform.client


@pytest.fixture(scope="module")
def module_client(module_db_url, demo_engine, tmp_path_factory) -> TestClient:
    """``client`` shared by the tests of one module and backend (one app, one database): for probes
    whose oracle is only the answer to their own request (hostile parameters: never a 5xx), where a
    fresh app and database per case cost more than the probe. Each probe then also meets a database
    that every earlier probe wrote to, as on a real server. Tests whose oracle is the server's state
    (a price book's currency, who can read what) keep ``client``."""
    settings = make_settings(tmp_path_factory.mktemp("module-app"), module_db_url)
    ctx, _ = build_context(settings, demo_engine, upgrade_db=False)
    with TestClient(create_app(ctx, owns_engine=False), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="session")
def adapter_dirs(demo_model_dir, tmp_path_factory) -> dict[str, Path]:
    """Real PEFT adapters: two on the demo model, one on a different base model."""
    from loraplex.engine.demo_model import create_random_checkpoint

    root = tmp_path_factory.mktemp("adapters")
    other_base = create_random_checkpoint(
        root / "other-base", preset="demo", hidden_size=64, intermediate_size=128, num_hidden_layers=2
    )
    return {
        "good": make_peft_adapter(demo_model_dir, root / "good", r=4, targets=("q_proj", "v_proj")),
        "good2": make_peft_adapter(
            demo_model_dir, root / "good2", r=8, targets=("q_proj", "o_proj", "down_proj"), seed=1
        ),
        "wrong_base": make_peft_adapter(other_base, root / "wrong-base", r=4),
    }


@pytest.fixture(scope="session")
def good_files(adapter_dirs) -> dict[str, bytes]:
    return adapter_files(adapter_dirs["good"])


@pytest.fixture
def live_factory(tmp_path, db_url, demo_engine):
    """``live_factory(**settings_overrides)`` → a ``harness.live.LiveServer`` (``.ctx``, ``.url``) on
    this test's database; stopped at the end of the test."""
    servers: list[LiveServer] = []

    def make(gw=None, **overrides) -> LiveServer:
        settings = make_settings(tmp_path / f"s{len(servers)}", db_url, **overrides)
        ctx, _ = build_context(settings, gw or demo_engine, upgrade_db=False)
        srv = LiveServer(create_app(ctx, owns_engine=False), ctx)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def cli_env(tmp_path, monkeypatch, demo_model_dir) -> list[str]:
    """Arguments for ``run_cli`` (platform_helpers): a data dir of this test's, the demo model."""
    monkeypatch.setenv("LORAPLEX_ENGINE__MODEL", str(demo_model_dir))
    monkeypatch.setenv("LORAPLEX_ADAPTERS__FILE_ROOTS", json.dumps([tempfile.gettempdir()]))  # file:// test folders
    return ["--data-dir", str(tmp_path / "data")]


@pytest.fixture
def db_url_postgres(request):
    """A fresh, migrated PostgreSQL database (for tests that pick their backend themselves)."""
    need_postgres()
    url = pg_create_database(template=request.getfixturevalue("pg_template"))
    yield url
    pg_drop_database(url)


@pytest.fixture
def private_postgres():
    """A PostgreSQL server of this test's own (it may stop and start it): skipped where the server
    binaries or root are missing, unless LORAPLEX_REQUIRE_POSTGRES=1."""
    reason = postgres.unavailable_reason()
    if reason is not None:
        if os.environ.get("LORAPLEX_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"LORAPLEX_REQUIRE_POSTGRES=1: {reason}")
        pytest.skip(reason)
    server = postgres.PostgresServer()
    yield server
    server.destroy()


@pytest.fixture
def server(live_factory):
    """(context, url) of a live server on its own database (the session's engine)."""
    srv = live_factory()
    return srv.ctx, srv.url


@pytest.fixture
def tenant_setup(server, good_files):
    """A tenant with a key and an adapter "bot" on a live server, and an ``openai`` client for it."""
    return _tenant_setup(server, good_files)


@pytest.fixture(scope="module")
def module_tenant_setup(module_db_url, demo_engine, good_files, tmp_path_factory):
    """``tenant_setup`` shared by the tests of one module, for tests that only send requests and
    read answers (hostile bodies): one server, database, tenant and adapter upload per module and
    backend instead of one per test. Each test's requests then also meet a server that every
    earlier test's requests went through, as on a real server."""
    settings = make_settings(tmp_path_factory.mktemp("module-server"), module_db_url)
    ctx, _ = build_context(settings, demo_engine, upgrade_db=False)
    srv = LiveServer(create_app(ctx, owns_engine=False), ctx)
    try:
        yield _tenant_setup((srv.ctx, srv.url), good_files)
    finally:
        srv.stop()


def _tenant_setup(server, good_files):
    ctx, url = server
    with httpx.Client(base_url=url, headers=admin_headers(), timeout=30) as c:
        tid = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
        key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
        ada = c.post(
            "/admin/v1/adapters",
            data={"name": "bot", "tenant_id": tid},
            files={"file": ("bot.zip", zip_bytes(good_files))},
        ).json()
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
    return ctx, url, tid, key, ada, client


@pytest.fixture
def serve_process():
    """``serve_process(data_dir, model_dir, env=..., ...)`` → ``loraplex serve`` in its own process
    (harness.serve.ServeProcess) with the tests' admin key; killed at the end of the test."""
    started: list[ServeProcess] = []

    def start(data_dir, model_dir, **kwargs) -> ServeProcess:
        proc = ServeProcess(data_dir, model_dir, admin_key=ADMIN_KEY, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def alert_servers(tmp_path, db_url):
    """``make(**alert_overrides)`` → a LiveServer (no engine) on this test's database."""
    servers: list[LiveServer] = []

    def make(**overrides) -> LiveServer:
        settings = make_settings(tmp_path / f"s{len(servers)}", db_url, alerts=alert_settings(**overrides))
        ctx, _ = build_context(settings, LocalEngineClient.disabled(), upgrade_db=False)
        srv = LiveServer(create_app(ctx, owns_engine=False), ctx)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def receiver():
    """A real webhook receiver (alerts_helpers.Receiver) on loopback, stopped after the test."""
    r = Receiver()
    yield r
    r.stop()
