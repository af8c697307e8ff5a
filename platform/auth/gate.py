"""ASGI: a route that needs a key checks it before a byte of the body is read.

FastAPI reads (and parses) a request body before it resolves any dependency, so a key checked in
``require_admin`` / ``require_tenant`` alone lets anybody make the server read, buffer and parse
a body up to the route's limit first. ``AuthGate`` looks at the route a request will reach (the
app's own routes, matched as Starlette matches them) and, when that route depends on
``require_admin`` or ``require_tenant``, authenticates the ``Authorization`` header first: a
missing, wrong, revoked key or a suspended tenant is answered (401/403) without reading the
body, with ``Connection: close`` when a body was announced so that none of it is read after the
answer either. The result is left in the request's scope and the dependency reuses it (one key
lookup per request).

An unauthenticated client costs its request head, one route match and one keyed hash (plus a
database lookup for a key that is not cached); see docs/limits.md."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio.to_thread
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import SQLAlchemyError
from starlette.routing import Match

from loraplex.platform.auth.admin import Actor, authenticate_admin
from loraplex.platform.auth.key_cache import TenantAuth
from loraplex.platform.auth.tenant import authenticate_tenant
from loraplex.platform.errors import PlatformError, Unauthorized
from loraplex.platform.http_errors import error_body, error_response

if TYPE_CHECKING:
    from fastapi import FastAPI

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


def pre_authenticated(scope: dict, kind: Kind, token: str) -> Actor | TenantAuth | None:
    """What the gate found for this request (None outside the gate: it was not installed)."""
    found = (scope.get("state") or {}).get(SCOPE_KEY)
    if isinstance(found, Authenticated) and found.kind == kind and found.token == token:
        return found.principal
    return None


def _needed_key(route: APIRoute, checks: dict[Any, Kind]) -> Kind | None:
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        if dependant.call in checks:
            return checks[dependant.call]
        stack.extend(dependant.dependencies)
    return None


class AuthGate:
    def __init__(self, app, ctx: PlatformContext, fastapi_app: FastAPI, checks: dict[Any, Kind]) -> None:
        """``checks`` maps the dependency functions that demand a key to the kind of key."""
        self.app = app
        self.ctx = ctx
        self._fastapi = fastapi_app
        self._checks = checks
        self._table: list[tuple[Any, Kind | None]] | None = None

    def _routes(self) -> list[tuple[Any, Kind | None]]:
        # built on first use: every route is included by then
        if self._table is None:
            self._table = [
                (r, _needed_key(r, self._checks) if isinstance(r, APIRoute) else None)
                for r in self._fastapi.router.routes
            ]
        return self._table

    def _kind(self, scope: dict) -> Kind | None:
        for route, kind in self._routes():
            match, _ = route.matches(scope)
            if match is Match.FULL:  # the route Starlette will pick (first full match)
                return kind
        return None

    async def __call__(self, scope, receive, send):
        kind = self._kind(scope) if scope["type"] == "http" else None
        if kind is None:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            token = parse_bearer(headers.get(b"authorization", b"").decode("latin-1"))
            check = authenticate_admin if kind == "admin" else authenticate_tenant
            principal = await anyio.to_thread.run_sync(check, self.ctx, token)
        except PlatformError as exc:
            body = error_body(exc.message, exc.type, exc.param, exc.code)
            response = JSONResponse(body, status_code=exc.status_code, headers=_closing(headers, exc.headers))
            return await response(scope, receive, send)
        except SQLAlchemyError as exc:
            return await _database_failed(exc, headers)(scope, receive, send)
        scope.setdefault("state", {})[SCOPE_KEY] = Authenticated(kind, token, principal)
        await self.app(scope, receive, send)


def _closing(request_headers: dict, extra: dict | None) -> dict:
    """The refusal's headers: close the connection if a body was announced (it stays unread)."""
    out = dict(extra or {})
    length = request_headers.get(b"content-length", b"0")
    if b"transfer-encoding" in request_headers or (length.isdigit() and int(length) > 0) or not length.isdigit():
        out["connection"] = "close"
    return out


def _database_failed(exc: SQLAlchemyError, headers: dict) -> JSONResponse:
    from loraplex.platform.http_errors import DB_RETRY_AFTER_S
    from loraplex.platform.usage.ledger import is_unreachable

    if is_unreachable(exc):  # an outage: the same answer the routes give (http_errors)
        log.warning("database unavailable: %s", str(exc).splitlines()[0][:200])
        body = error_body("the database is unavailable; retry shortly", "service_unavailable", None, "database_unavailable")
        extra = {"retry-after": str(DB_RETRY_AFTER_S)}
        return JSONResponse(body, status_code=503, headers=_closing(headers, extra))
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal server error", code="internal_error", headers=_closing(headers, None))
