"""The routes are built once per process (``app.api_app``) and shared by every ``create_app(ctx)``;
each request carries its server's context in its ASGI state (``http/context_binding.BindContext``).
Hostile checks of that design: several servers of one process used at once (threads, the official
``openai`` client, streaming, n>1, admin writes) never see each other's context or database; the
answers outside the normal routes (unknown paths, wrong methods, redirects, the admin page's files,
/docs, /openapi.json, /metrics on and off, health) keep their shape; a request before the lifespan
ran, or with a foreign ``ctx`` already in its state, is served by its own server; an unexpected
error is answered and logged once; and single sign-on with different settings on two servers of one
process, against a real OpenID Connect provider."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from harness.live import LiveServer
from harness.oidc import OIDCProvider
from platform_helpers import ADMIN_KEY, admin_headers, make_settings, zip_bytes
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sso_helpers import USERS, authorize, begin, session_info, sign_in, sso_server

from loraplex.platform.app import api_app, build_context, create_app
from loraplex.platform.engine_client import LocalEngineClient
from loraplex.platform.keys.models import ApiKey
from loraplex.platform.tenants.models import Tenant
from loraplex.platform.usage.models import UsageRecord

KEY_A = "server-a-admin-key-0123456789abcdef"
KEY_B = "server-b-admin-key-0123456789abcdef"
RID = r"req_[0-9a-f]{32}"


def _second_database(tmp_path, db_url: str) -> str:
    """A second empty, migrated database beside ``db_url`` (a copy of it while still empty), for a
    second server of this process. SQLite only: the test is skipped on PostgreSQL."""
    import shutil

    if not db_url.startswith("sqlite:///"):
        pytest.skip("two databases of one backend: SQLite only here")
    target = tmp_path / "b-db" / "loraplex.db"
    target.parent.mkdir()
    shutil.copy(db_url.removeprefix("sqlite:///"), target)
    return f"sqlite:///{target}"


def _error_shape(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


def _db(ctx):
    """(tenant names, key tenant ids, usage (tenant id, status) pairs) in a server's own database."""
    with ctx.sessions() as s:
        names = sorted(s.scalars(select(Tenant.name)).all())
        key_tenants = set(s.scalars(select(ApiKey.tenant_id)).all())
        usage = [(r.tenant_id, r.status) for r in s.scalars(select(UsageRecord)).all()]
    return names, key_tenants, usage


def _scrape(url: str) -> dict[str, list]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


# ----------------------------------------------------------------- two servers, one process, at once
@pytest.fixture
def two_engine_servers(tmp_path, db_url, demo_engine, good_files):
    """Two live servers in this process on two databases (the session's engine shared, as the tests
    share it), with different admin keys; on each a tenant with a key and an adapter "bot"."""

    servers = []
    for name, key in (("a", KEY_A), ("b", KEY_B)):
        # db_url is one database: server B gets a copy of it (empty and migrated, as A's is now)
        url = _second_database(tmp_path, db_url) if name == "b" else db_url
        settings = make_settings(tmp_path / name, url, admin_key=key, observability={"tenant_labels": True})
        ctx, _ = build_context(settings, demo_engine, upgrade_db=False)
        srv = LiveServer(create_app(ctx, owns_engine=False), ctx)
        with httpx.Client(base_url=srv.url, headers=admin_headers(key), timeout=60) as c:
            tid = c.post("/admin/v1/tenants", json={"name": f"tenant-{name}"}).json()["id"]
            tkey = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
            up = c.post(
                "/admin/v1/adapters",
                data={"name": "bot", "tenant_id": tid},
                files={"file": ("bot.zip", zip_bytes(good_files))},
            )
            assert up.status_code == 201, up.text
        servers.append({"name": name, "srv": srv, "ctx": ctx, "admin": key, "tid": tid, "key": tkey})
    yield servers
    for s in servers:
        s["srv"].stop()


def _tenant_work(s: dict, other: dict, round_: int) -> dict:
    """One client's requests to server ``s``: generation (stream, n>1, adapter), reads, admin
    writes, and ``other``'s credentials, which ``s`` must refuse. Returns what it saw."""
    url, base = s["srv"].url, s["ctx"].engine.model_name
    client = openai.OpenAI(base_url=url + "/v1", api_key=s["key"], max_retries=0, timeout=120)
    seen: dict = {"generations": 0}
    chat = client.chat.completions.create(
        model="bot", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, n=2, temperature=0.7
    )
    assert len(chat.choices) == 2 and chat.model == "bot"
    seen["generations"] += 1
    stream = client.chat.completions.create(
        model=base, messages=[{"role": "user", "content": "Hello"}], max_tokens=3, stream=True
    )
    chunks = list(stream)
    assert chunks and all(c.model == base for c in chunks)
    seen["generations"] += 1
    comp = client.completions.create(model="bot", prompt="abc", max_tokens=2, stream=True, n=2)
    assert {c.choices[0].index for c in comp if c.choices} <= {0, 1}
    seen["generations"] += 1
    # this server's models: its own tenant's adapter, never the other's
    models = {m.id for m in client.models.list()}
    assert models == {base, "bot"}, models
    with httpx.Client(base_url=url, timeout=60) as h:
        # the other server's tenant key and admin key are strangers here
        _error_shape(h.get("/v1/models", headers=admin_headers(other["key"])), 401)
        _error_shape(h.get("/admin/v1/tenants", headers=admin_headers(other["admin"])), 401)
        # admin writes and reads on this server: its own tenants only
        made = h.post(
            "/admin/v1/tenants", json={"name": f"{s['name']}-extra-{round_}"}, headers=admin_headers(s["admin"])
        )
        assert made.status_code == 201, made.text
        k = h.post(f"/admin/v1/tenants/{made.json()['id']}/keys", json={}, headers=admin_headers(s["admin"]))
        assert k.status_code == 201, k.text
        listed = h.get("/admin/v1/tenants", headers=admin_headers(s["admin"])).json()["data"]
        assert all(t["name"].startswith((f"tenant-{s['name']}", f"{s['name']}-extra-")) for t in listed), listed
        tok = h.post("/tokenize", json={"model": base, "prompt": "abc"}, headers=admin_headers(s["key"]))
        assert tok.status_code == 200, tok.text
    return seen


def test_two_servers_hammered_at_once_each_see_only_their_own_context(two_engine_servers):
    a, b = two_engine_servers
    rounds = 3
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            (s["name"], r): pool.submit(_tenant_work, s, o, r) for r in range(rounds) for s, o in ((a, b), (b, a))
        }
        results = {k: f.result(timeout=600) for k, f in futures.items()}
    for s in (a, b):
        s["ctx"].ledger.flush()
        names, key_tenants, usage = _db(s["ctx"])
        assert names == sorted([f"tenant-{s['name']}", *(f"{s['name']}-extra-{r}" for r in range(rounds))])
        with s["ctx"].sessions() as sess:
            own_ids = set(sess.scalars(select(Tenant.id)).all())
        assert key_tenants <= own_ids
        generations = sum(v["generations"] for (n, _), v in results.items() if n == s["name"])
        # each generation request is one usage record, of this server's tenant, on this database
        assert sorted(usage) == [(s["tid"], "ok")] * generations, usage
        m = _scrape(s["srv"].url)
        by_tenant = {}
        for sample in m["loraplex:requests"]:
            if sample.name.endswith("_total"):
                by_tenant[sample.labels["tenant"]] = by_tenant.get(sample.labels["tenant"], 0) + sample.value
        assert by_tenant == {s["tid"]: generations}, by_tenant


@pytest.fixture
def two_plain_servers(tmp_path, db_url):
    """Two live servers without an engine in this process, on two databases, with different
    settings: A serves /metrics, B does not; different admin keys."""

    b_db = _second_database(tmp_path, db_url)
    out = []
    for name, url, key, metrics in (("a", db_url, KEY_A, True), ("b", b_db, KEY_B, False)):
        settings = make_settings(tmp_path / name, url, admin_key=key, observability={"metrics": metrics})
        ctx, _ = build_context(settings, LocalEngineClient.disabled(), upgrade_db=False)
        out.append((name, key, LiveServer(create_app(ctx, owns_engine=False), ctx)))
    yield out
    for *_, srv in out:
        srv.stop()


def test_servers_with_different_settings_answer_each_with_their_own(two_plain_servers):
    (na, ka, sa), (nb, kb, sb) = two_plain_servers
    barrier = threading.Barrier(4)

    def worker(name, key, srv, other_key, i):
        barrier.wait(timeout=60)
        with httpx.Client(base_url=srv.url, timeout=60) as h:
            for j in range(15):
                made = h.post("/admin/v1/tenants", json={"name": f"{name}-{i}-{j}"}, headers=admin_headers(key))
                assert made.status_code == 201, made.text
                _error_shape(h.get("/admin/v1/tenants", headers=admin_headers(other_key)), 401)
                m = h.get("/metrics")
                if name == "a":
                    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain"), m.text
                else:
                    assert _error_shape(m, 404)["message"] == "metrics are off (observability.metrics)"
                health = h.get("/health")
                assert health.json() == {"status": "ok", "engine": False}

    with ThreadPoolExecutor(max_workers=4) as pool:
        jobs = [
            pool.submit(worker, n, k, s, ok, i)
            for i in range(2)
            for (n, k, s), ok in (((na, ka, sa), kb), ((nb, kb, sb), ka))
        ]
        for j in jobs:
            j.result(timeout=600)
    for name, _key, srv in two_plain_servers:
        names, _, _ = _db(srv.ctx)
        assert names == sorted(f"{name}-{i}-{j}" for i in range(2) for j in range(15))


def test_two_apps_interleaved_on_one_event_loop(tmp_path, db_url):
    """Many requests to two apps at once on ONE event loop (httpx's ASGI transport): the context of
    one request never bleeds into another's, whatever the interleaving."""

    b_db = _second_database(tmp_path, db_url)
    apps = {}
    for name, url, key in (("a", db_url, KEY_A), ("b", b_db, KEY_B)):
        ctx, _ = build_context(
            make_settings(tmp_path / name, url, admin_key=key), LocalEngineClient.disabled(), upgrade_db=False
        )
        apps[name] = (create_app(ctx, owns_engine=False), key, ctx)

    async def go():
        clients = {
            n: httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", headers=admin_headers(k))
            for n, (app, k, _) in apps.items()
        }

        async def one(n, i):
            r = await clients[n].post("/admin/v1/tenants", json={"name": f"{n}-{i}"})
            assert r.status_code == 201, r.text
            listed = (await clients[n].get("/admin/v1/tenants", params={"limit": 500})).json()["data"]
            assert all(t["name"].startswith(f"{n}-") for t in listed), (n, listed)

        await asyncio.gather(*(one(n, i) for i in range(20) for n in apps))
        for c in clients.values():
            await c.aclose()

    asyncio.run(go())
    for name, (_app, _key, ctx) in apps.items():
        assert _db(ctx)[0] == sorted(f"{name}-{i}" for i in range(20))
        ctx.close()


# ----------------------------------------------------------------- the lifespan and the request state
@pytest.fixture
def plain_ctx(tmp_path, db_url):
    ctx, _ = build_context(make_settings(tmp_path, db_url), LocalEngineClient.disabled(), upgrade_db=False)
    yield ctx
    ctx.close()


def test_a_request_before_the_lifespan_ran_is_served(plain_ctx):
    client = TestClient(create_app(plain_ctx, owns_engine=False), raise_server_exceptions=False)  # no `with`
    assert client.get("/health").json() == {"status": "ok", "engine": False}
    made = client.post("/admin/v1/tenants", json={"name": "early"}, headers=admin_headers())
    assert made.status_code == 201, made.text
    assert [t["name"] for t in client.get("/admin/v1/tenants", headers=admin_headers()).json()["data"]] == ["early"]
    missing = client.get("/nope")
    _error_shape(missing, 404)
    assert missing.headers["x-request-id"].startswith("req_")


def test_uvicorn_with_the_lifespan_off_serves(plain_ctx):
    with LiveServer(create_app(plain_ctx, owns_engine=False), plain_ctx, lifespan="off") as srv:
        with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=30) as c:
            assert c.post("/admin/v1/tenants", json={"name": "nolife"}).status_code == 201
            assert c.get("/ready").json()["status"] == "ready"
    assert _db(plain_ctx)[0] == ["nolife"]


async def _asgi(app, method: str, path: str, state: dict | None, headers=()) -> tuple[int, dict, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"t"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
    }
    if state is not None:
        scope["state"] = state
    out: dict = {"status": 0, "headers": {}, "body": b""}
    done = False

    async def receive():
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()

    async def send(msg):
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
            out["headers"] = {k.decode(): v.decode() for k, v in msg.get("headers", [])}
        elif msg["type"] == "http.response.body":
            out["body"] += msg.get("body", b"")

    await app(scope, receive, send)
    return out["status"], out["headers"], out["body"]


def test_a_foreign_ctx_in_the_request_state_is_replaced(tmp_path, db_url, plain_ctx):
    """A server (or a lifespan of an app around ours) that hands requests a state already holding a
    ``ctx`` — another server's — does not make our routes serve that server."""
    import json

    foreign, _ = build_context(
        make_settings(tmp_path / "foreign", db_url, admin_key=KEY_B), LocalEngineClient.disabled(), upgrade_db=False
    )
    try:
        app = create_app(plain_ctx, owns_engine=False)
        auth = [(b"authorization", f"Bearer {ADMIN_KEY}".encode())]
        for state in (None, {}, {"ctx": foreign}, {"ctx": None, "request_id": "forged"}):
            status, headers, body = asyncio.run(_asgi(app, "GET", "/admin/v1/tenants", state, auth))
            assert status == 200, body
            assert json.loads(body)["data"] == []
            status, _, body = asyncio.run(_asgi(app, "GET", "/health", state))
            assert status == 200 and json.loads(body) == {"status": "ok", "engine": False}
    finally:
        foreign.close()


def test_one_server_mounted_inside_another_serves_its_own_context(tmp_path, db_url):
    """create_app(B) mounted under /b of create_app(A)'s process-level router: a request for /b/...
    is B's (the inner binding wins), one for A's own paths is A's."""

    from starlette.applications import Starlette
    from starlette.routing import Mount

    b_db = _second_database(tmp_path, db_url)
    ctx_a, _ = build_context(make_settings(tmp_path / "a", db_url, admin_key=KEY_A), LocalEngineClient.disabled())
    ctx_b, _ = build_context(make_settings(tmp_path / "b", b_db, admin_key=KEY_B), LocalEngineClient.disabled())
    outer = Starlette(routes=[Mount("/b", app=create_app(ctx_b, owns_engine=False))])
    with TestClient(outer) as c:
        made = c.post("/b/admin/v1/tenants", json={"name": "via-mount"}, headers=admin_headers(KEY_B))
        assert made.status_code == 201, made.text
    assert _db(ctx_b)[0] == ["via-mount"] and _db(ctx_a)[0] == []
    ctx_a.close()
    ctx_b.close()


# ----------------------------------------------------------------- answers outside the normal routes
@pytest.fixture(scope="module")
def edge_client(tmp_path_factory, sqlite_template):
    """One server for the probes below: they change nothing, and routing does not depend on the
    database (SQLite only; the module's other tests run on both)."""
    import shutil

    folder = tmp_path_factory.mktemp("edge")
    shutil.copy(sqlite_template, folder / "loraplex.db")
    settings = make_settings(folder, f"sqlite:///{folder / 'loraplex.db'}")
    ctx, _ = build_context(settings, LocalEngineClient.disabled(), upgrade_db=False)
    with TestClient(create_app(ctx, owns_engine=False), raise_server_exceptions=False) as c:
        yield c


NOT_FOUND = [
    "/",
    "/nonexistent",
    "/HEALTH",
    "/Admin/",
    "//health",
    "/./health",
    "/%2e%2e/health",
    "/health%00",
    "/%C3%BC",
    "/%C3%BCn%C3%AFcode",
    "/" + "a" * 9000,
    "/admin/index.html",
    "/admin/static/",
    "/admin/static/missing.js",
    "/admin/static/views",
    "/admin/static/%2e%2e/index.html",
    "/admin/static/..%2findex.html",
    "/admin/static/%2e%2e/%2e%2e/platform/app.py",
    "/admin/static//etc/passwd",
    "/admin//v1/tenants",
    "/admin/sso",
    "/v1",
    "/organization",
]


@pytest.mark.parametrize("path", NOT_FOUND, ids=lambda p: p[:40])
def test_unknown_paths_are_404_in_openai_shape_with_a_request_id(edge_client, path):
    """Sent as raw ASGI requests (an HTTP client would normalise ``/./`` and ``%2e%2e`` away)."""
    import json

    auth = [(b"authorization", f"Bearer {ADMIN_KEY}".encode())]
    # the admin page's files are a static mount: other methods are 405 there, as they always were
    methods = ("GET", "HEAD") if path.startswith("/admin/static/") else ("GET", "POST", "DELETE")
    for method in methods:
        status, headers, body = asyncio.run(_asgi(edge_client.app, method, path, {}, auth))
        assert status == 404, (method, body)
        assert headers["content-type"] == "application/json"
        assert method == "HEAD" or json.loads(body) == {
            "error": {"message": "no such route", "type": "not_found_error", "param": None, "code": None}
        }
        assert re.fullmatch(RID, headers["x-request-id"])


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/health", "GET"),
        ("DELETE", "/ready", "GET"),
        ("HEAD", "/health", "GET"),
        ("OPTIONS", "/health", "GET"),
        ("POST", "/admin/static/app.js", "GET, HEAD"),
        ("PUT", "/admin/", "GET"),
        ("POST", "/admin", "GET"),
        ("GET", "/admin/sso/logout", "POST"),
        ("PATCH", "/metrics", "GET"),
    ],
)
def test_wrong_methods_are_405_with_allow(edge_client, method, path, allow):
    resp = edge_client.request(method, path, headers=admin_headers())
    assert resp.status_code == 405 and resp.headers["allow"] == allow
    if method == "HEAD":  # no body
        return
    err = _error_shape(resp, 405)
    assert err["message"] == "Method Not Allowed" and err["type"] == "invalid_request_error"
    assert resp.headers["allow"] == allow
    assert resp.headers["x-request-id"].startswith("req_")


def test_redirects_admin_page_and_static_files(edge_client):
    r = edge_client.get("/admin", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "admin/" and "x-request-id" in r.headers
    page = edge_client.get("/admin/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store" and page.headers["x-content-type-options"] == "nosniff"
    js = edge_client.get("/admin/static/app.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript") and js.text
    assert "x-request-id" in js.headers
    r = edge_client.get("/admin/static", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "http://testserver/admin/static/"
    r = edge_client.get("/health/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "http://testserver/health"
    # a trailing slash on an API path is served by the key check first, as before (401, no redirect)
    r = edge_client.get("/admin/v1/tenants/", follow_redirects=False)
    assert _error_shape(r, 401)["code"] == "missing_api_key"


def test_openapi_docs_and_the_schema_in_code_agree(edge_client):
    schema = edge_client.get("/openapi.json")
    assert schema.status_code == 200 and "x-request-id" in schema.headers
    served = schema.json()
    assert served == edge_client.app.openapi() == api_app().openapi()
    assert served["info"]["title"] == "loraplex" and served["info"]["version"] == "0.1.0"
    assert "/admin/v1/tenants" in served["paths"] and "/v1/chat/completions" in served["paths"]
    assert "/health" in served["paths"] and "/metrics" not in served["paths"] and "/admin/" not in served["paths"]
    assert "servers" not in served  # no root path: no servers entry
    docs = edge_client.get("/docs")
    assert docs.status_code == 200 and "'/openapi.json'" in docs.text
    assert edge_client.get("/redoc").status_code == 200


def test_health_ready_and_metrics_with_the_engine_disabled(tmp_path, db_url):
    for metrics in (True, False):
        settings = make_settings(tmp_path / str(metrics), db_url, observability={"metrics": metrics})
        ctx, _ = build_context(settings, LocalEngineClient.disabled(), upgrade_db=False)
        with TestClient(create_app(ctx, owns_engine=False)) as c:
            assert c.get("/health").json() == {"status": "ok", "engine": False}
            ready = c.get("/ready")
            assert ready.status_code == 200 and ready.json()["engine"] == "disabled"
            m = c.get("/metrics")
            assert m.headers["x-request-id"].startswith("req_")
            if metrics:
                assert m.status_code == 200 and "loraplex:requests_total" in m.text
            else:
                err = _error_shape(m, 404)
                assert err["type"] == "not_found_error"


def test_the_client_request_id_is_echoed_on_every_kind_of_answer(edge_client):
    for method, path in (("GET", "/nope"), ("POST", "/health"), ("GET", "/admin"), ("GET", "/admin/v1/tenants")):
        resp = edge_client.request(method, path, headers={"x-request-id": "mine.1"}, follow_redirects=False)
        assert resp.headers["x-request-id"] == "mine.1", (method, path)


# ----------------------------------------------------------------- an unexpected error
def test_an_unexpected_error_is_answered_with_a_request_id_and_logged_once(plain_ctx, caplog):
    """A route that raises: one OpenAI-style 500 carrying x-request-id, and ONE "unhandled error"
    log record (each server's and the shared routes' error handlers are both installed)."""
    real = plain_ctx.engine

    class Broken:
        def __getattr__(self, name):
            if name == "enabled":
                raise RuntimeError("engine state unreadable")
            return getattr(real, name)

    with TestClient(create_app(plain_ctx, owns_engine=False), raise_server_exceptions=False) as c:
        plain_ctx.engine = Broken()
        try:
            with caplog.at_level(logging.ERROR, logger="loraplex.platform"):
                resp = c.get("/health", headers={"x-request-id": "boom-1"})
        finally:
            plain_ctx.engine = real
    err = _error_shape(resp, 500)
    assert err["code"] == "internal_error"
    assert resp.headers["x-request-id"] == "boom-1"
    unhandled = [r for r in caplog.records if r.getMessage() == "unhandled error"]
    assert len(unhandled) == 1, f"one failure logged {len(unhandled)} times"


# ----------------------------------------------------------------- single sign-on on two servers
@pytest.fixture(scope="module")
def provider():
    with OIDCProvider(USERS) as p:
        yield p


def test_two_sso_servers_in_one_process_each_use_their_own_settings(tmp_path, db_url, provider):

    b_db = _second_database(tmp_path, db_url)
    # A: ops are admins; B: ops only view, and its client id differs
    a = sso_server(tmp_path / "a", db_url, provider.issuer)
    b = sso_server(
        tmp_path / "b",
        b_db,
        provider.issuer,
        client_id="another-client",
        role_map={"ops": ["viewer"]},
    )
    plain_ctx, _ = build_context(make_settings(tmp_path / "c", db_url), LocalEngineClient.disabled(), upgrade_db=False)
    c = LiveServer(create_app(plain_ctx, owns_engine=False), plain_ctx)
    try:
        assert a.ctx.oidc is not b.ctx.oidc and plain_ctx.oidc is None
        results: dict = {}

        def run(name, srv):
            # each server's authorization request names its own client and its own callback
            browser = httpx.Client(timeout=60)
            url = begin(browser, srv)
            q = httpx.URL(url).params
            results[name + "-authz"] = (q["client_id"], q["redirect_uri"])
            cb = authorize(browser, url, "alice")
            assert browser.get(cb).status_code == 303
            results[name] = session_info(browser, srv)
            results[name + "-write"] = browser.post(
                f"{srv.url}/admin/v1/tenants",
                json={"name": f"by-{name}"},
                headers={"x-csrf-token": results[name].get("csrf_token", ""), "origin": srv.url},
            ).status_code
            browser.close()

        threads = [threading.Thread(target=run, args=(n, s)) for n, s in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert results["a-authz"] == ("loraplex-admin", f"{a.url}/admin/sso/callback")
        assert results["b-authz"] == ("another-client", f"{b.url}/admin/sso/callback")
        assert results["a"]["signed_in"] and results["a"]["roles"] == ["admin"]
        assert results["b"]["signed_in"] and results["b"]["roles"] == ["viewer"]
        assert results["a-write"] == 201 and results["b-write"] == 403
        # a session of A is nobody at B; the server without SSO has no sign-in
        browser = sign_in(a, "alice")
        token = next(ck.value for ck in browser.cookies.jar if ck.name == "lpx_admin_session")
        at_b = httpx.get(f"{b.url}/admin/sso/session", cookies={"lpx_admin_session": token}, timeout=30)
        assert at_b.status_code == 200 and not at_b.json()["signed_in"]
        assert httpx.get(f"{c.url}/admin/sso/session", timeout=30).json() == {"enabled": False, "signed_in": False}
        assert _error_shape(httpx.get(f"{c.url}/admin/sso/login", timeout=30), 404)["code"] == "not_found"
        browser.close()
    finally:
        a.stop()
        b.stop()
        c.stop()


def test_a_refusal_at_the_rate_limit_is_counted_by_its_own_server(tmp_path, db_url):
    """The 429 handler finds the observer through the request's context: a tenant refused on A is
    counted in A's metrics, never in B's (both serve /metrics, in one process, used at once)."""

    b_db = _second_database(tmp_path, db_url)
    servers = {}
    for name, url, key in (("a", db_url, KEY_A), ("b", b_db, KEY_B)):
        ctx, _ = build_context(
            make_settings(tmp_path / name, url, admin_key=key), LocalEngineClient.disabled(), upgrade_db=False
        )
        servers[name] = LiveServer(create_app(ctx, owns_engine=False), ctx)
    try:
        keys = {}
        for name, key in (("a", KEY_A), ("b", KEY_B)):
            with httpx.Client(base_url=servers[name].url, headers=admin_headers(key), timeout=30) as c:
                tid = c.post("/admin/v1/tenants", json={"name": "t"}).json()["id"]
                keys[name] = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
                if name == "a":
                    assert c.put(f"/admin/v1/tenants/{tid}/quota", json={"rpm": 2}).status_code == 200

        def hit(name):
            with httpx.Client(base_url=servers[name].url, headers=admin_headers(keys[name]), timeout=30) as c:
                return [c.get("/v1/models").status_code for _ in range(6)]

        with ThreadPoolExecutor(max_workers=2) as pool:
            got = dict(zip("ab", pool.map(hit, "ab"), strict=True))
        assert got["a"] == [200, 200, 429, 429, 429, 429] and got["b"] == [200] * 6, got

        def refused(name) -> float:
            m = _scrape(servers[name].url)
            return sum(s.value for s in m.get("loraplex:rate_limited_requests", []) if s.name.endswith("_total"))

        assert refused("a") == 4 and refused("b") == 0
    finally:
        for srv in servers.values():
            srv.stop()  # its lifespan closes its context
