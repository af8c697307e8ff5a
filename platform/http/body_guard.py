"""ASGI guard on every request body: a size limit and a deadline, chosen per route by ``BodyRule``.

- Size: a declared ``Content-Length`` over the limit is refused (413) before a byte is read; a
  chunked body (or one whose length lies) is counted as it arrives and refused the moment it
  passes the limit.
- Time: the whole body must arrive within ``deadline_s`` of the request head, and no gap between
  two of its chunks may exceed ``idle_s``: a client trickling a body (slowloris) gets 408.

Either answer carries ``Connection: close``, so the rest of the body is never read. Nothing is
buffered here: the bytes reach the route as they arrive (an upload streams to disk), and a route
that never reads its body reads none of it. Authentication runs before this guard
(``auth/gate.py``), so these bounds are what an authenticated client can cost; an unauthenticated
one costs its headers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loraplex.platform.http.error_handlers import error_response

if TYPE_CHECKING:
    from loraplex.platform.settings import Settings

# Room for the multipart envelope and the small form fields around an uploaded file.
MULTIPART_OVERHEAD = 64 * 1024


@dataclass(frozen=True)
class BodyRule:
    max_bytes: int
    deadline_s: float  # the whole body, from the request head
    idle_s: float  # the longest wait for the next chunk
    message: str  # said in the 413
    param: str | None = None


class _Refused(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class BodyGuard:
    def __init__(self, app, rule_for: Callable[[dict], BodyRule | None]) -> None:
        self.app = app
        self.rule_for = rule_for

    async def __call__(self, scope, receive, send):
        rule = self.rule_for(scope) if scope["type"] == "http" else None
        if rule is None:
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > rule.max_bytes:
            return await _refuse(413, rule, scope, receive, send)
        deadline = time.monotonic() + rule.deadline_s
        seen = 0
        refused: int | None = None
        started = False
        body_complete = False

        async def guarded_receive():
            nonlocal seen, refused, body_complete
            if refused is not None:
                raise _Refused(refused)
            if body_complete:
                # After the body, receive() only waits for the client to leave (DisconnectWatch,
                # Starlette's streaming response): that wait lasts as long as the answer does and
                # must never time out. A deadline here cut every stream after ``idle_s``: the 408
                # was raised in the disconnect listener and the stream's further sends dropped.
                return await receive()
            wait = min(rule.idle_s, deadline - time.monotonic())
            try:
                if wait <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), wait)
            except asyncio.TimeoutError:
                refused = 408
                raise _Refused(408) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > rule.max_bytes:
                    refused = 413
                    raise _Refused(413)
                body_complete = not message.get("more_body", False)
            return message

        async def guarded_send(message):
            nonlocal started
            if refused is None:  # the route's own answer to the exception we raised is dropped
                started = True
                await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            if refused is None:
                raise
        if refused is not None and not started:
            await _refuse(refused, rule, scope, receive, send)


async def _refuse(status: int, rule: BodyRule, scope, receive, send) -> None:
    if status == 413:
        response = error_response(
            413, rule.message, param=rule.param, code="payload_too_large", headers={"connection": "close"}
        )
    else:
        response = error_response(
            408,
            f"the request body did not arrive in time (whole body within {rule.deadline_s:g} s, "
            f"no pause over {rule.idle_s:g} s)",
            code="request_timeout",
            headers={"connection": "close"},
        )
    await response(scope, receive, send)


def route_rules(
    settings: Settings, *, tenant_prefixes: tuple[str, ...], upload_path: str
) -> Callable[[dict], BodyRule]:
    """Which bound each request's body is under: every route has one (a route that reads no body
    gets the smallest, so a stray body costs nothing either)."""
    limits, uploads = settings.limits, settings.uploads
    tenant = BodyRule(
        limits.max_body_bytes,
        limits.body_timeout_s,
        limits.body_idle_timeout_s,
        f"the request body is larger than {limits.max_body_bytes} bytes",
    )
    admin = BodyRule(
        limits.max_admin_body_bytes,
        limits.body_timeout_s,
        limits.body_idle_timeout_s,
        f"the request body is larger than {limits.max_admin_body_bytes} bytes",
    )
    # The multipart adapter upload (its JSON twin on the same path, by reference, is an admin body).
    upload = BodyRule(
        uploads.max_upload_bytes + MULTIPART_OVERHEAD,
        uploads.upload_timeout_s,
        limits.body_idle_timeout_s,
        f"the upload is larger than {uploads.max_upload_bytes} bytes",
        param="file",
    )

    def rule_for(scope: dict) -> BodyRule:
        path = scope["path"]
        if path.startswith(tenant_prefixes):
            return tenant
        if scope["method"] == "POST" and path.rstrip("/") == upload_path:
            ctype = dict(scope["headers"]).get(b"content-type", b"")
            if not ctype.split(b";")[0].strip().lower().endswith(b"json"):
                return upload
        return admin  # the admin API, and every other route (none of which reads a body)

    return rule_for
