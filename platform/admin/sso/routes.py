"""The sign-in routes of the admin page: /admin/sso/login → the provider → /admin/sso/callback →
a session cookie; /admin/sso/session tells the page who is signed in (and its CSRF token);
/admin/sso/logout revokes the session. They sit outside /admin/v1 (the admin key's API)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from loraplex.platform.admin.sso import sessions
from loraplex.platform.admin.sso.oidc import LoginRefused, OIDCClient, PendingLogin
from loraplex.platform.admin.sso.roles import roles_for_claims
from loraplex.platform.audit import service as audit
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.deps import ContextDep
from loraplex.platform.errors import Forbidden, NotFound
from loraplex.platform.settings import SSOSettings

SSO_PREFIX = "/admin/sso"
router = APIRouter(prefix=SSO_PREFIX, tags=["sso"])


def _sso(ctx: Any) -> SSOSettings:
    if not ctx.settings.sso.enabled:
        raise NotFound("single sign-on is not configured (sso.enabled)")
    return ctx.settings.sso


def _client(ctx: Any) -> OIDCClient:
    assert ctx.oidc is not None  # made with the context when sso.enabled (``_sso`` checked it)
    return ctx.oidc


def _secure(settings: SSOSettings) -> bool:
    return settings.base_url.lower().startswith("https://")


@router.get("/login", include_in_schema=False)
def login(request: Request, ctx: ContextDep) -> Response:
    settings = _sso(ctx)
    url, pending = _client(ctx).begin(time.time())
    resp = RedirectResponse(url, status_code=302)
    resp.set_cookie(
        sessions.LOGIN_COOKIE,
        pending.seal(ctx.hasher),
        max_age=settings.login_timeout_s,
        path=SSO_PREFIX,
        httponly=True,
        secure=_secure(settings),
        samesite="lax",  # the provider's redirect back is a top-level GET: Lax sends it, Strict would not
    )
    return resp


@router.get("/callback", include_in_schema=False)
def callback(request: Request, ctx: ContextDep, state: str = "", code: str = "", error: str = "") -> Response:
    settings = _sso(ctx)
    if error:
        raise LoginRefused(f"the identity provider refused the sign-in: {error[:100]}")
    pending = PendingLogin.unseal(request.cookies.get(sessions.LOGIN_COOKIE, ""), ctx.hasher, time.time())
    claims = _client(ctx).finish(pending, state, code)
    roles = roles_for_claims(claims, settings.role_claim, settings.role_map)
    email = str(claims.get("email") or claims["sub"])
    if not roles:
        raise Forbidden(f"{email} has no admin role here (sso.role_claim {settings.role_claim!r}, sso.role_map)")
    token, row = sessions.create(ctx, str(claims["sub"]), email, roles)
    with unit_of_work(ctx.sessions) as session:
        audit.record(
            session, f"sso:{email}", "sso.login", "admin_session", row.token_hash[:16], None,
            {"email": email, "roles": roles, "expires_at": row.expires_at.isoformat()},
        )  # fmt: skip
    # Always to the admin page (never a URL from the request: no open redirect), at its public address.
    resp = RedirectResponse(settings.base_url.rstrip("/") + "/admin/", status_code=303)
    resp.delete_cookie(sessions.LOGIN_COOKIE, path=SSO_PREFIX)
    resp.set_cookie(
        sessions.SESSION_COOKIE,
        token,
        max_age=settings.session_lifetime_s,
        path="/admin",
        httponly=True,  # the page's scripts never see the token; they get the CSRF token instead
        secure=_secure(settings),
        samesite="lax",
    )
    return resp


@router.get("/session")
def current_session(request: Request, ctx: ContextDep) -> JSONResponse:
    """Whether SSO is on and who is signed in in this browser, with the CSRF token the admin page
    sends as ``X-CSRF-Token`` on every change."""
    if not ctx.settings.sso.enabled:
        return JSONResponse({"enabled": False, "signed_in": False})
    token = request.cookies.get(sessions.SESSION_COOKIE, "")
    row = sessions.find(ctx, token) if token else None
    if row is None:
        return JSONResponse({"enabled": True, "signed_in": False, "login_url": f"{SSO_PREFIX}/login"})
    return JSONResponse(
        {
            "enabled": True,
            "signed_in": True,
            "email": row.email,
            "roles": row.roles,
            "expires_at": row.expires_at.isoformat(),
            "csrf_token": sessions.csrf_token(ctx, token),
        },
        headers={"cache-control": "no-store"},
    )


@router.post("/logout")
def logout(request: Request, ctx: ContextDep) -> JSONResponse:
    """Revoke this browser's session (a CSRF-checked change like any other)."""
    _sso(ctx)
    token = request.cookies.get(sessions.SESSION_COOKIE, "")
    actor = sessions.authenticate(ctx, "POST", token, request.headers) if token else None
    if actor is not None and sessions.revoke(ctx, token):
        with unit_of_work(ctx.sessions) as session:
            audit.record(session, actor.name, "sso.logout", "admin_session", sessions.token_hash(token)[:16])
    resp = JSONResponse({"signed_out": True})
    resp.delete_cookie(sessions.SESSION_COOKIE, path="/admin")
    return resp
