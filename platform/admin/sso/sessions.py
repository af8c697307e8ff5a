"""Admin page sessions: a random token in an HttpOnly cookie, only its SHA-256 in ``admin_sessions``.

A request authenticated by the cookie that changes something must also prove it comes from the
admin page itself (a browser sends cookies with cross-site form posts too): the ``X-CSRF-Token``
header, an HMAC of the session token with the server secret (bound to the session, never stored,
only readable by the page through ``GET /admin/sso/session``), AND an ``Origin`` (or, without one,
a ``Referer``) equal to ``sso.base_url``'s origin. The admin key (``Authorization: Bearer``) needs
neither: a browser never adds it by itself."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from datetime import datetime, timedelta
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sqlalchemy import select

from loraplex.platform.admin.sso.models import AdminSession
from loraplex.platform.auth.admin import Actor
from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.errors import Forbidden, Unauthorized

if TYPE_CHECKING:
    from loraplex.platform.context import PlatformContext

SESSION_COOKIE = "lpx_admin_session"
LOGIN_COOKIE = "lpx_sso_login"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_token(ctx: PlatformContext, token: str) -> str:
    return ctx.hasher.hash("csrf:" + token)


def cookie_value(cookie_header: str, name: str) -> str | None:
    try:
        jar = SimpleCookie(cookie_header)
    except CookieError:
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None and morsel.value else None


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else ""


def create(ctx: PlatformContext, subject: str, email: str, roles: list[str]) -> tuple[str, AdminSession]:
    token = secrets.token_urlsafe(32)
    now = utcnow()
    row = AdminSession(
        token_hash=token_hash(token),
        subject=subject[:255],
        email=email[:255],
        roles=sorted(roles),
        created_at=now,
        expires_at=now + timedelta(seconds=ctx.settings.sso.session_lifetime_s),
    )
    with unit_of_work(ctx.sessions) as session:
        session.add(row)
    return token, row


def find(ctx: PlatformContext, token: str, now: datetime | None = None) -> AdminSession | None:
    """The live session of this token: None when unknown, expired or revoked."""
    with unit_of_work(ctx.sessions) as session:
        row = session.get(AdminSession, token_hash(token))
        if row is None or row.revoked_at is not None or row.expires_at <= (now or utcnow()):
            return None
        session.expunge(row)
        return row


def revoke(ctx: PlatformContext, token: str) -> bool:
    with unit_of_work(ctx.sessions) as session:
        row = session.get(AdminSession, token_hash(token))
        if row is None or row.revoked_at is not None:
            return False
        row.revoked_at = utcnow()
        return True


def revoke_all_for(ctx: PlatformContext, email: str) -> int:
    """Sign a user out everywhere (e.g. they left the company before their sessions expire)."""
    with unit_of_work(ctx.sessions) as session:
        rows = session.scalars(
            select(AdminSession).where(AdminSession.email == email, AdminSession.revoked_at.is_(None))
        ).all()
        for row in rows:
            row.revoked_at = utcnow()
        return len(rows)


def check_csrf(ctx: PlatformContext, token: str, headers: Mapping[str, str]) -> None:
    sent = headers.get(CSRF_HEADER, "")
    if not sent or not hmac.compare_digest(sent, csrf_token(ctx, token)):
        raise Forbidden("missing or wrong X-CSRF-Token header for a signed-in admin session", code="csrf_failed")
    expected = origin_of(ctx.settings.sso.base_url)
    came_from = headers.get("origin") or origin_of(headers.get("referer", ""))
    if came_from.lower() != expected:
        raise Forbidden("the request's Origin is not the admin page's (sso.base_url)", code="csrf_failed")


def authenticate(ctx: PlatformContext, method: str, token: str, headers: Mapping[str, str]) -> Actor:
    """The actor of a cookie-authenticated admin request (401: no live session; 403: CSRF)."""
    row = find(ctx, token)
    if row is None:
        raise Unauthorized("the admin session has expired or was signed out; sign in again", code="invalid_session")
    if method.upper() not in SAFE_METHODS:
        check_csrf(ctx, token, headers)
    return Actor(f"sso:{row.email}", roles=frozenset(row.roles))


SESSION_MARK = "session:"  # what the auth gate records as the "token" of a cookie-authenticated request


def session_token(ctx: PlatformContext, headers: Mapping[str, str]) -> str | None:
    """The session cookie's token of a request that carries no Authorization header (the admin
    key wins when both are sent); None when SSO is off or there is no cookie."""
    if not ctx.settings.sso.enabled or headers.get("authorization"):
        return None
    return cookie_value(headers.get("cookie", ""), SESSION_COOKIE)
