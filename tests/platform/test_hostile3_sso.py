"""Hostile probes of SSO for the admin page (hostile3 review), against the real mock OIDC provider."""

from __future__ import annotations

import httpx
import pytest
from harness.oidc import OIDCProvider
from platform_helpers import admin_headers
from sso_helpers import USERS, authorize, page_headers, sign_in, sso_server

pytestmark = pytest.mark.slow
LOG: list[str] = []


def _rec(name, r):
    LOG.append(f"{name} | {r.status_code} | {r.headers.get('location', '')[:80]} {r.text[:140]}".replace("\n", " "))
    return r


@pytest.fixture(scope="module")
def provider():
    with OIDCProvider(USERS) as p:
        yield p


@pytest.fixture
def srv(tmp_path, db_url, provider):
    server = sso_server(tmp_path, db_url, provider.issuer)
    yield server
    server.stop()


def test_callback_forgeries_and_open_redirect(srv):
    u = f"{srv.url}/admin/sso"
    with httpx.Client(timeout=30) as b:
        assert _rec("callback no cookie", b.get(f"{u}/callback", params={"state": "x", "code": "y"})).status_code in (
            400,
            401,
            403,
        )
        b.cookies.set("lpx_admin_login", "A" * 8000, path="/admin/sso")
        assert _rec("callback 8 KB garbage login cookie", b.get(f"{u}/callback?state=x&code=y")).status_code < 500
        b.cookies.clear()
        r = _rec("login ?next=https://evil.example", b.get(f"{u}/login", params={"next": "https://evil.example/"}))
        assert "evil" not in r.headers["location"]
        cb = authorize(b, r.headers["location"], "alice")
        saved = dict(b.cookies)
        r = _rec("callback + next=evil", b.get(cb + "&next=https://evil.example/&redirect_uri=https://evil.example/"))
        assert r.status_code == 303 and r.headers["location"] == f"{srv.url}/admin/"
        # the same code again, with the login cookie put back (a replay)
        b2 = httpx.Client(timeout=30, cookies=saved)
        assert _rec("callback replayed code+state", b2.get(cb)).status_code in (400, 401, 403)
        r = _rec("callback error=CRLF+html", b.get(f"{u}/callback", params={"error": "x\r\nSet-Cookie: a=b<script>"}))
        assert r.status_code < 500 and "set-cookie: a=b" not in str(r.headers).lower()
        b.cookies.set("lpx_admin_session", "S" * 8000, path="/admin")
        assert _rec("8 KB session cookie GET tenants", b.get(f"{srv.url}/admin/v1/tenants")).status_code == 401


def test_csrf_across_sessions_and_origin_null(srv):
    a, v = sign_in(srv, "alice"), sign_in(srv, "vera")
    ha, hv = page_headers(a, srv), page_headers(v, srv)
    url = f"{srv.url}/admin/v1/tenants"
    assert _rec("alice POST with vera's CSRF token", a.post(url, json={"name": "x"}, headers=hv)).status_code == 403
    assert (
        _rec("alice POST Origin null", a.post(url, json={"name": "x"}, headers={**ha, "origin": "null"})).status_code
        == 403
    )
    assert (
        _rec(
            "alice POST Origin evil", a.post(url, json={"name": "x"}, headers={**ha, "origin": "https://evil.example"})
        ).status_code
        == 403
    )
    hb = {"x-csrf-token": ha["x-csrf-token"], "referer": "https://evil.example/admin/"}
    assert _rec("alice POST no Origin, evil Referer", a.post(url, json={"name": "x"}, headers=hb)).status_code == 403
    assert _rec("alice POST right headers", a.post(url, json={"name": "x"}, headers=ha)).status_code == 201


def test_viewer_tries_every_write_route(srv):
    v = sign_in(srv, "vera")
    h = page_headers(v, srv)
    tid = httpx.post(f"{srv.url}/admin/v1/tenants", json={"name": "t"}, headers=admin_headers()).json()["id"]
    out = []
    spec = httpx.get(f"{srv.url}/openapi.json", headers=admin_headers()).json()
    for path, ops in spec["paths"].items():
        if not path.startswith("/admin/v1"):
            continue
        for m in sorted(k.upper() for k in ops if k.upper() not in ("GET", "HEAD", "PARAMETERS")):
            p = path.replace("{tenant_id}", tid)
            for name in ("{key_id}", "{adapter_id}", "{webhook_id}", "{job_id}", "{id}"):
                p = p.replace(name, "x")
            r = _rec(f"viewer {m} {path}", v.request(m, f"{srv.url}{p}", json={}, headers=h))
            out.append((m, path, r.status_code))
    assert out and all(s == 403 for _, _, s in out), [o for o in out if o[2] != 403]


def test_tenant_admin_reaching_another_tenant(srv):
    admin = httpx.Client(base_url=f"{srv.url}/admin/v1", headers=admin_headers(), timeout=30)
    acme = admin.post("/tenants", json={"name": "acme"}).json()["id"]
    other = admin.post("/tenants", json={"name": "other"}).json()["id"]
    own_key = admin.post(f"/tenants/{acme}/keys", json={"name": "k"}).json()["id"]
    srv.ctx.settings.sso.role_map["acme-admins"] = [f"tenant_admin:{acme}"]
    t = sign_in(srv, "tom")
    h = page_headers(t, srv)
    b = f"{srv.url}/admin/v1"
    qs = [
        f"tenant_id={other}&tenant_id={acme}",
        f"tenant_id={acme}&tenant_id={other}",
        f"tenant_id={acme}%00",
        f"Tenant_Id={other}",
        f"tenant_id={acme}&tenant_id[]={other}",
    ]
    for q in qs:
        for path in ("/spend", "/spend/export", "/usage", "/usage/export", "/adapters"):
            r = _rec(f"tom GET {path}?{q}", t.get(f"{b}{path}?{q}"))
            assert r.status_code < 500
            assert other not in r.text or r.status_code == 403
    for m, path, body in [
        ("GET", f"/tenants/{acme}/../{other}", None),
        ("GET", f"/tenants/{acme}%2F..%2F{other}", None),
        ("POST", f"/tenants/{acme}/keys", {"name": "k", "tenant_id": other}),
        ("PUT", f"/keys/{own_key}/scope", {"models": ["*"], "tenant_id": other}),
        ("GET", "/prices", None),
        ("GET", "/alerts/events", None),
        ("GET", "/webhooks", None),
        ("GET", f"/alerts/events?tenant_id={acme}", None),
    ]:
        r = _rec(f"tom {m} {path} {body}", t.request(m, f"{b}{path}", json=body, headers=h))
        assert r.status_code < 500


def teardown_module(module):
    with open("/tmp/h3-sso.log", "a") as f:
        f.write("\n".join(LOG) + "\n")
