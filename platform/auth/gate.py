"""ASGI: a route that needs a key checks it before a byte of the body is read.

FastAPI reads (and parses) a request body before it resolves any dependency, so a key checked in
``require_admin`` / ``require_tenant`` alone lets anybody make the server read, buffer and parse
a body up to the route's limit first. ``AuthGate`` knows which paths need which key (``KeyPolicy``:
the admin API and vLLM's LoRA routes an admin key, the rest of ``/v1/`` and ``/tokenize`` a tenant
key; a test checks it against every route's dependencies) and authenticates the
``Authorization`` header first: a missing, wrong, revoked key or a suspended tenant is answered
(401/403) without reading the body, with ``Connection: close`` when a body was announced so that
none of it is read after the answer either. The result is left in the request's scope and the
dependency reuses it (one key lookup per request). With ``sso.enabled``, an admin path may be
authenticated instead by the admin page's session cookie (no Authorization header sent): the
session is looked up and, for a change, its CSRF token and Origin checked, here too, before any
body byte (admin/sso/sessions.py).

An unauthenticated client costs its request head, one route match and one keyed hash (plus a
database lookup for a key that is not cached); see docs/limits.md."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from loraplex.platform.admin.sso.sessions import SESSION_MARK, session_token
from loraplex.platform.admin.sso.sessions import authenticate as authenticate_session
from loraplex.platform.auth.admin import Actor, authenticate_admin
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.auth.tenant import authenticate_tenant
from loraplex.platform.errors import PlatformError, Unauthorized
from loraplex.platform.http.error_handlers import error_body, error_response

if TYPE_CHECKING:
    from loraplex.platform.context import PlatformContext

log = logging.getLogger("loraplex.platform")

Kind = Literal["admin", "tenant"]
SCOPE_KEY = "loraplex_auth"  # in scope["state"]: what the gate found


@dataclass(frozen=True)
class Authenticated:
    kind: Kind
    token: str
    principal: Actor | TenantAuth


def parse_bearer(header: str) -> str:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
    return token.strip()


def pre_authenticated(scope: Mapping[str, Any], kind: Kind, token: str) -> Actor | TenantAuth | None:
    """What the gate found for this request (None outside the gate: it was not installed)."""
    found = (scope.get("state") or {}).get(SCOPE_KEY)
    if isinstance(found, Authenticated) and found.kind == kind and found.token == token:
        return found.principal
    return None


@dataclass(frozen=True)
class KeyPolicy:
    """Which key a path needs: exact admin paths, then admin prefixes, then tenant prefixes."""

    admin_paths: tuple[str, ...]
    admin_prefixes: tuple[str, ...]
    tenant_prefixes: tuple[str, ...]

    def kind(self, path: str) -> Kind | None:
        if path.rstrip("/") in self.admin_paths or path.startswith(self.admin_prefixes):
            return "admin"
        if path.startswith(self.tenant_prefixes):
            return "tenant"
        return None


class AuthGate:
    def __init__(self, app, ctx: PlatformContext, policy: KeyPolicy) -> None:
        self.app = app
        self.ctx = ctx
        self.policy = policy

    async def __call__(self, scope, receive, send):
        kind = self.policy.kind(scope["path"]) if scope["type"] == "http" else None
        if kind is None:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            text = _text(headers)
            cookie = session_token(self.ctx, text) if kind == "admin" else None
            principal: Actor | TenantAuth
            if cookie is not None:  # the admin page, signed in with SSO (admin/sso/sessions.py)
                token = SESSION_MARK + cookie
                principal = await anyio.to_thread.run_sync(
                    authenticate_session, self.ctx, scope["method"], cookie, text
                )
            else:
                token = parse_bearer(text.get("authorization", ""))
                if kind == "admin":
                    principal = await anyio.to_thread.run_sync(authenticate_admin, self.ctx, token)
                else:
                    principal = await anyio.to_thread.run_sync(authenticate_tenant, self.ctx, token)
        except PlatformError as exc:
            body = error_body(exc.message, exc.type, exc.param, exc.code)
            response = JSONResponse(body, status_code=exc.status_code, headers=_closing(headers, exc.headers))
            return await response(scope, receive, send)
        except SQLAlchemyError as exc:
            return await _database_failed(exc, headers)(scope, receive, send)
        scope.setdefault("state", {})[SCOPE_KEY] = Authenticated(kind, token, principal)
        await self.app(scope, receive, send)


def _text(headers: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers.items()}


def _closing(request_headers: dict, extra: dict | None) -> dict:
    """The refusal's headers: close the connection if a body was announced (it stays unread)."""
    out = dict(extra or {})
    length = request_headers.get(b"content-length", b"0")
    if b"transfer-encoding" in request_headers or (length.isdigit() and int(length) > 0) or not length.isdigit():
        out["connection"] = "close"
    return out


def _database_failed(exc: SQLAlchemyError, headers: dict) -> JSONResponse:
    from loraplex.platform.db.session import is_unreachable
    from loraplex.platform.http.error_handlers import DB_RETRY_AFTER_S

    if is_unreachable(exc):  # an outage: the same answer the routes give (http/error_handlers.py)
        log.warning("database unavailable: %s", str(exc).splitlines()[0][:200])
        body = error_body(
            "the database is unavailable; retry shortly", "service_unavailable", None, "database_unavailable"
        )
        extra = {"retry-after": str(DB_RETRY_AFTER_S)}
        return JSONResponse(body, status_code=503, headers=_closing(headers, extra))
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal server error", code="internal_error", headers=_closing(headers, None))
