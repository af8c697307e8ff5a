"""ASGI guard: a request body over the limit gets 413 before it is read whole (the declared
Content-Length first; a chunked body is counted as it arrives). One mechanism for the tenant API
(``/v1/``, ``/tokenize``, ``/detokenize``), the admin API and the adapter upload route
(``size_limit.UploadSizeLimit``, with its own larger limit)."""

from __future__ import annotations

import asyncio

from loraplex.platform.http_errors import error_response


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(
        self,
        app,
        max_bytes: int,
        *,
        prefix: str | tuple[str, ...] | None = None,
        path: str | None = None,
        exclude: str | None = None,
        method: str | None = None,
        message: str | None = None,
        param: str | None = None,
    ) -> None:
        self.app = app
        self.limit = max_bytes
        self.prefix, self.path, self.method, self.exclude = prefix, path, method, exclude
        self.message = message or f"the request body is larger than {max_bytes} bytes"
        self.param = param

    def _guards(self, scope) -> bool:
        if scope["type"] != "http" or (self.method is not None and scope["method"] != self.method):
            return False
        if self.path is not None:
            return scope["path"].rstrip("/") == self.path
        if self.exclude is not None and scope["path"].rstrip("/") == self.exclude:
            return False
        return self.prefix is None or scope["path"].startswith(self.prefix)

    async def __call__(self, scope, receive, send):
        if not self._guards(scope):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(scope, receive, send)
        seen = 0
        exceeded = False
        started = False

        async def counting_receive():
            nonlocal seen, exceeded
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                exceeded = True
                raise _TooLarge()
            return message

        async def guarded_send(message):
            nonlocal started
            if not exceeded:
                started = True
                await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _TooLarge:
            pass
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send):
        response = error_response(
            413, self.message, param=self.param, code="payload_too_large", headers={"connection": "close"}
        )
        await response(scope, receive, send)


class BodyTimeout:
    """ASGI guard: the whole request body must arrive within ``timeout_s`` (a client trickling a
    body byte by byte holds a worker and its memory otherwise): 408 and the connection is closed.
    It reads the body before the route runs, so put it inside the size limits."""

    def __init__(self, app, timeout_s: float, *, exclude: str | None = None) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.exclude = exclude

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or (self.exclude is not None and scope["path"].rstrip("/") == self.exclude):
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []

        async def read_all() -> bool:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return False  # the client left while sending
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    return True

        try:
            if not await asyncio.wait_for(read_all(), self.timeout_s):
                return
        except asyncio.TimeoutError:
            response = error_response(
                408,
                f"the request body did not arrive within {self.timeout_s:g} s",
                code="request_timeout",
                headers={"connection": "close"},
            )
            return await response(scope, receive, send)
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
