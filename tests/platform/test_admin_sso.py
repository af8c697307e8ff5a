"""SSO for the admin page against a real OpenID Connect provider (oidc-provider-mock, PKCE enforced
as a real provider does), on SQLite and PostgreSQL: the whole sign-in, every forged or stale step
refused, sessions that expire and are revoked, CSRF on cookie-authenticated changes, roles (viewer,
tenant admin) as an allowlist, the audit actor, and the admin key unchanged for automation."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import httpx
import pytest
from harness.oidc import OIDCProvider
from platform_helpers import admin_headers
from sqlalchemy import select, update
from sso_helpers import USERS, authorize, begin, page_headers, s256, session_info, sign_in, sso_server

from loraplex.platform.admin.sso.models import AdminSession
from loraplex.platform.audit.models import AuditEntry
from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import unit_of_work


@pytest.fixture(scope="module")
def provider():
    with OIDCProvider(USERS) as p:
        yield p


@pytest.fixture
def srv(tmp_path, db_url, provider):
    server = sso_server(tmp_path, db_url, provider.issuer)
    yield server
    server.stop()


def _audit(srv, action: str) -> list[str]:
    with unit_of_work(srv.ctx.sessions) as s:
        return [e.actor for e in s.scalars(select(AuditEntry).where(AuditEntry.action == action))]


def _error(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body
    return body["error"]


def test_sign_in_end_to_end_session_cookie_and_audit(srv):
    browser = sign_in(srv, "alice")
    cookie = next(c for c in browser.cookies.jar if c.name == "lpx_admin_session")
    assert cookie.path == "/admin" and cookie.has_nonstandard_attr("HttpOnly")
    assert not cookie.secure  # http base_url; https makes it Secure (test below)
    info = session_info(browser, srv)
    assert info["signed_in"] and info["email"] == "alice@example.com" and info["roles"] == ["admin"]
    with unit_of_work(srv.ctx.sessions) as s:  # only the token's SHA-256 is stored
        hashes = s.scalars(select(AdminSession.token_hash)).all()
    assert hashes == [hashlib.sha256(cookie.value.encode()).hexdigest()]

    assert browser.get(f"{srv.url}/admin/v1/tenants").status_code == 200
    made = browser.post(f"{srv.url}/admin/v1/tenants", json={"name": "acme"}, headers=page_headers(browser, srv))
    assert made.status_code == 201, made.text
    assert _audit(srv, "tenant.create") == ["sso:alice@example.com"]
    assert _audit(srv, "sso.login") == ["sso:alice@example.com"]


def test_https_base_url_makes_the_cookie_secure(tmp_path, db_url, provider):
    server = sso_server(tmp_path, db_url, provider.issuer)
    try:
        server.ctx.settings.sso.base_url = "https://admin.example.com"
        resp = httpx.get(f"{server.url}/admin/sso/login")
        set_cookie = resp.headers["set-cookie"].lower()
        assert "secure" in set_cookie and "httponly" in set_cookie and "samesite=lax" in set_cookie
        assert (
            "redirect_uri=https%3a%2f%2fadmin.example.com%2fadmin%2fsso%2fcallback" in resp.headers["location"].lower()
        )
    finally:
        server.stop()


def _refused(srv, browser: httpx.Client, callback_url: str) -> dict:
    resp = browser.get(callback_url)
    assert resp.status_code == 400, resp.text
    assert "lpx_admin_session" not in {c.name for c in browser.cookies.jar}
    assert not session_info(browser, srv)["signed_in"]
    return _error(resp)


def test_wrong_state_refused(srv):
    browser = httpx.Client(timeout=30)
    callback = authorize(browser, begin(browser, srv), "alice", state="forged-state")
    assert "state" in _refused(srv, browser, callback)["message"]


def test_callback_in_another_browser_refused(srv):
    """A callback URL (code and state) carried to a browser that did not start the sign-in."""
    first = httpx.Client(timeout=30)
    callback = authorize(first, begin(first, srv), "alice")
    _refused(srv, httpx.Client(timeout=30), callback)


def test_wrong_nonce_refused(srv):
    """The provider signs an ID token for another nonce (a replayed token): refused."""
    browser = httpx.Client(timeout=30)
    callback = authorize(browser, begin(browser, srv), "alice", nonce="replayed-nonce")
    assert "nonce" in _refused(srv, browser, callback)["message"].lower()


def test_wrong_pkce_refused(srv):
    """A code issued for another verifier's challenge (an intercepted code): the provider refuses it."""
    browser = httpx.Client(timeout=30)
    callback = authorize(browser, begin(browser, srv), "alice", code_challenge=s256("the attacker's verifier"))
    assert "refused the code" in _refused(srv, browser, callback)["message"]


def test_user_without_a_mapped_role_cannot_sign_in(srv):
    browser = httpx.Client(timeout=30)
    resp = browser.get(authorize(browser, begin(browser, srv), "nobody"))
    assert resp.status_code == 403 and _error(resp)["type"] == "permission_error"
    assert not session_info(browser, srv)["signed_in"]


def test_expired_and_revoked_sessions_refused(srv):
    browser = sign_in(srv, "alice")
    with unit_of_work(srv.ctx.sessions) as s:
        s.execute(update(AdminSession).values(expires_at=utcnow() - timedelta(seconds=1)))
    resp = browser.get(f"{srv.url}/admin/v1/tenants")
    assert resp.status_code == 401 and _error(resp)["code"] == "invalid_session"

    browser = sign_in(srv, "alice")
    headers = page_headers(browser, srv)
    assert browser.post(f"{srv.url}/admin/sso/logout").status_code == 403  # logout is a change: CSRF-checked
    assert browser.post(f"{srv.url}/admin/sso/logout", headers=headers).json() == {"signed_out": True}
    with unit_of_work(srv.ctx.sessions) as s:
        assert s.scalar(select(AdminSession).where(AdminSession.revoked_at.is_not(None))) is not None
    assert _audit(srv, "sso.logout") == ["sso:alice@example.com"]
    # the revoked token, replayed by hand (the browser dropped the cookie): refused
    stale = {"cookie": f"lpx_admin_session={_last_token}"} if (_last_token := _token(browser)) else None
    assert stale is None  # the cookie is gone from the browser
    assert browser.get(f"{srv.url}/admin/v1/tenants").status_code == 401


def test_revoked_token_replayed_is_refused(srv):
    browser = sign_in(srv, "alice")
    token = _token(browser)
    browser.post(f"{srv.url}/admin/sso/logout", headers=page_headers(browser, srv))
    resp = httpx.get(f"{srv.url}/admin/v1/tenants", headers={"cookie": f"lpx_admin_session={token}"})
    assert resp.status_code == 401 and _error(resp)["code"] == "invalid_session"


def _token(browser: httpx.Client) -> str | None:
    return next((c.value for c in browser.cookies.jar if c.name == "lpx_admin_session"), None)


def test_csrf_header_and_origin_required_for_changes(srv):
    browser = sign_in(srv, "alice")
    url, body = f"{srv.url}/admin/v1/tenants", {"name": "acme"}
    good = page_headers(browser, srv)
    other = sign_in(srv, "alice")  # the same user's other session: its token does not fit this one
    cases = {
        "missing": {"origin": srv.url},
        "mismatched": {"x-csrf-token": "0" * 64, "origin": srv.url},
        "other session's": {"x-csrf-token": page_headers(other, srv)["x-csrf-token"], "origin": srv.url},
        "foreign origin": {"x-csrf-token": good["x-csrf-token"], "origin": "http://evil.example"},
        "no origin": {"x-csrf-token": good["x-csrf-token"]},
    }
    for what, headers in cases.items():
        resp = browser.post(url, json=body, headers=headers)
        assert resp.status_code == 403, what
        assert _error(resp)["code"] == "csrf_failed", what
    assert _audit(srv, "tenant.create") == []
    referer_only = {"x-csrf-token": good["x-csrf-token"], "referer": f"{srv.url}/admin/"}
    assert browser.post(url, json=body, headers=referer_only).status_code == 201
    assert browser.post(url, json={"name": "beta"}, headers=good).status_code == 201


def test_viewer_reads_but_cannot_write(srv):
    browser = sign_in(srv, "vera")
    assert session_info(browser, srv)["roles"] == ["viewer"]
    assert browser.get(f"{srv.url}/admin/v1/tenants").status_code == 200
    assert browser.get(f"{srv.url}/admin/v1/audit").status_code == 200
    resp = browser.post(f"{srv.url}/admin/v1/tenants", json={"name": "x"}, headers=page_headers(browser, srv))
    assert resp.status_code == 403 and _error(resp)["type"] == "permission_error"
    assert _audit(srv, "tenant.create") == []


def test_tenant_admin_only_its_own_tenant(srv):
    admin = httpx.Client(base_url=f"{srv.url}/admin/v1", headers=admin_headers(), timeout=30)
    acme = admin.post("/tenants", json={"name": "acme"}).json()["id"]
    other = admin.post("/tenants", json={"name": "other"}).json()["id"]
    other_key = admin.post(f"/tenants/{other}/keys", json={"name": "k"}).json()["id"]
    srv.ctx.settings.sso.role_map["acme-admins"] = [f"tenant_admin:{acme}"]

    browser = sign_in(srv, "tom")
    h = page_headers(browser, srv)
    base = f"{srv.url}/admin/v1"
    allowed = [
        browser.get(f"{base}/tenants/{acme}"),
        browser.get(f"{base}/tenants/{acme}/keys"),
        browser.get(f"{base}/tenants/{acme}/quota"),
        browser.get(f"{base}/usage", params={"tenant_id": acme}),
        browser.get(f"{base}/adapters", params={"tenant_id": acme}),
    ]
    assert [r.status_code for r in allowed] == [200] * 5, [r.text for r in allowed]
    made = browser.post(f"{base}/tenants/{acme}/keys", json={"name": "ci"}, headers=h)
    assert made.status_code == 201
    assert browser.delete(f"{base}/keys/{made.json()['id']}", headers=h).status_code == 200

    refused = [
        browser.get(f"{base}/tenants/{other}"),
        browser.get(f"{base}/tenants/{other}/keys"),
        browser.post(f"{base}/tenants/{other}/keys", json={"name": "x"}, headers=h),
        browser.delete(f"{base}/keys/{other_key}", headers=h),
        browser.put(f"{base}/keys/{other_key}/scope", json={}, headers=h),
        browser.get(f"{base}/tenants"),  # every tenant
        browser.get(f"{base}/usage"),  # every tenant's usage
        browser.get(f"{base}/usage", params={"tenant_id": other}),
        browser.put(f"{base}/tenants/{acme}/quota", json={"rpm": 10**6}, headers=h),  # quotas are the operator's
        browser.patch(f"{base}/tenants/{acme}", json={"priority": 0}, headers=h),
        browser.get(f"{base}/audit"),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused), [r.text for r in refused]
    assert all(_error(r)["type"] == "permission_error" for r in refused)
    assert admin.get(f"/tenants/{other}/keys").json()["data"][0]["revoked_at"] is None
    assert _audit(srv, "key.create") == ["admin", "sso:tom@example.com"]
    assert _audit(srv, "key.revoke") == ["sso:tom@example.com"]


def test_admin_key_still_works_without_csrf(srv):
    """Automation: Bearer admin key, no cookie, no CSRF header, no Origin; even next to a cookie."""
    resp = httpx.post(f"{srv.url}/admin/v1/tenants", json={"name": "auto"}, headers=admin_headers())
    assert resp.status_code == 201
    browser = sign_in(srv, "vera")  # a viewer's cookie does not lower the key's rights
    resp = browser.post(f"{srv.url}/admin/v1/tenants", json={"name": "auto2"}, headers=admin_headers())
    assert resp.status_code == 201
    assert _audit(srv, "tenant.create") == ["admin", "admin"]
    assert httpx.get(f"{srv.url}/admin/v1/tenants", headers=admin_headers("wrong-key-0123456789")).status_code == 401


def test_sso_off_by_default(tmp_path, db_url):
    from harness.live import LiveServer
    from platform_helpers import make_settings

    from loraplex.platform.app import build_context, create_app

    ctx, _ = build_context(make_settings(tmp_path, db_url), upgrade_db=False)
    with LiveServer(create_app(ctx), ctx) as server:
        assert httpx.get(f"{server.url}/admin/sso/session").json() == {"enabled": False, "signed_in": False}
        assert httpx.get(f"{server.url}/admin/sso/login").status_code == 404
        # a cookie is not a way in while SSO is off
        resp = httpx.get(f"{server.url}/admin/v1/tenants", headers={"cookie": "lpx_admin_session=x"})
        assert resp.status_code == 401


def test_revoke_every_session_of_a_person(srv):
    """`loraplex admin revoke-sso-sessions EMAIL`: both of alice's browsers are out, vera stays in."""
    from loraplex.platform.admin.sso.sessions import revoke_all_for

    first, second, other = sign_in(srv, "alice"), sign_in(srv, "alice"), sign_in(srv, "vera")
    assert revoke_all_for(srv.ctx, "alice@example.com") == 2
    assert [b.get(f"{srv.url}/admin/v1/tenants").status_code for b in (first, second, other)] == [401, 401, 200]


def test_csrf_refusal_comes_before_the_body_is_read(srv):
    """The gate answers a cookie-authenticated change without its CSRF token before reading the
    body (and closes the connection, so none of it is read after the answer either)."""
    browser = sign_in(srv, "alice")
    resp = browser.post(
        f"{srv.url}/admin/v1/adapters",
        content=b"x" * (1024 * 1024),
        headers={"origin": srv.url, "content-type": "multipart/form-data; boundary=b"},
    )
    assert resp.status_code == 403 and _error(resp)["code"] == "csrf_failed"
    assert resp.headers.get("connection") == "close"
