"""Helpers of the SSO tests: a server with ``[sso]`` pointing at a real OIDC provider, and a
browser-like sign-in through the provider's own authorization form (httpx, cookies kept)."""

from __future__ import annotations

import base64
import hashlib
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
from harness.live import LiveServer
from platform_helpers import make_settings

from loraplex.platform.app import build_context, create_app

CLIENT_ID, CLIENT_SECRET = "loraplex-admin", "s3cret-of-the-client"
USERS = {
    "alice": {"email": "alice@example.com", "groups": ["ops"]},
    "vera": {"email": "vera@example.com", "groups": ["auditors"]},
    "tom": {"email": "tom@example.com", "groups": ["acme-admins"]},
    "nobody": {"email": "nobody@example.com", "groups": ["marketing"]},
}


def sso_server(tmp_path, db_url, issuer: str, tenant_id: str = "acme", **sso) -> LiveServer:
    settings = make_settings(
        tmp_path / "srv",
        db_url,
        sso={
            "enabled": True,
            "issuer": issuer,
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "base_url": "http://placeholder.invalid",
            "role_claim": "groups",
            "role_map": {"ops": ["admin"], "auditors": ["viewer"], "acme-admins": [f"tenant_admin:{tenant_id}"]},
            **sso,
        },
    )
    ctx, _ = build_context(settings, upgrade_db=False)
    srv = LiveServer(create_app(ctx), ctx)
    # The server's own origin is only known once it listens (port 0); the OIDC client reads it
    # from the settings at each sign-in.
    ctx.settings.sso.base_url = srv.url
    return srv


def begin(browser: httpx.Client, srv: LiveServer) -> str:
    """Start a sign-in: the provider's authorization URL (the login cookie is now in ``browser``)."""
    resp = browser.get(f"{srv.url}/admin/sso/login")
    assert resp.status_code == 302, resp.text
    return resp.headers["location"]


def authorize(browser: httpx.Client, authorize_url: str, sub: str, **replace: str) -> str:
    """Pick ``sub`` on the provider's form (as a user clicks it); return the callback URL it sends
    the browser to. ``replace``: query parameters of the authorization request to tamper with."""
    parts = urlsplit(authorize_url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()} | replace
    url = urlunsplit(parts._replace(query=urlencode(query)))
    resp = browser.post(url, data={"sub": sub})
    assert resp.status_code == 302, resp.text
    return resp.headers["location"]


def sign_in(srv: LiveServer, sub: str) -> httpx.Client:
    browser = httpx.Client(timeout=30)
    callback = authorize(browser, begin(browser, srv), sub)
    resp = browser.get(callback)
    assert resp.status_code == 303, resp.text
    assert resp.headers["location"] == f"{srv.url}/admin/"
    return browser


def session_info(browser: httpx.Client, srv: LiveServer) -> dict:
    resp = browser.get(f"{srv.url}/admin/sso/session")
    assert resp.status_code == 200
    return resp.json()


def page_headers(browser: httpx.Client, srv: LiveServer) -> dict[str, str]:
    """What the admin page sends with a change: its CSRF token and (the browser adds it) Origin."""
    return {"x-csrf-token": session_info(browser, srv)["csrf_token"], "origin": srv.url}


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
