"""``x-request-id`` on every response: the client's own when it sent a valid one (so its logs and
ours name a request the same way), otherwise one made here (``req_`` + 32 hex digits, OpenAI's
shape; the official SDKs expose it as ``response._request_id``). The same id is in the access log
(``access_log``), the "request finished" log line and the request's usage records.

A client's id is valid when it is 1 to 128 characters of ``A-Z a-z 0-9 . _ : -``: anything else
(too long, spaces, control characters, non-ASCII, several headers) is replaced, never echoed, so a
hostile header cannot forge log lines or fill the usage table. It is not a key: two requests may
carry the same client id; each engine request keeps its own unique id."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

HEADER = b"x-request-id"
_VALID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")

# The id of the request being served, for the access log filter (uvicorn logs from inside the
# send of the request's own task, so it sees the value set for that request).
current: ContextVar[str | None] = ContextVar("loraplex_request_id", default=None)


def choose(headers: list[tuple[bytes, bytes]]) -> str:
    given = [v for k, v in headers if k.lower() == HEADER]
    if len(given) == 1 and _VALID.fullmatch(given[0]):
        return given[0].decode("ascii")
    return "req_" + uuid.uuid4().hex


def of(scope: Mapping[str, Any]) -> str | None:
    """The id of a request (routes read it through ``request.state.request_id``)."""
    return (scope.get("state") or {}).get("request_id")


class RequestId:
    """Pure ASGI, outermost: every response, refusals of the other guards included, carries it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = choose(scope.get("headers") or [])
        scope.setdefault("state", {})["request_id"] = rid
        token = current.set(rid)
        raw = rid.encode("ascii")

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, raw)]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current.reset(token)
