"""ASGI guard: a request body over the limit gets 413 before it is read whole (the declared
Content-Length first; a chunked body is counted as it arrives). One mechanism for the tenant API
(``/v1/`` prefix) and the adapter upload route (``size_limit.UploadSizeLimit``)."""

from __future__ import annotations

from loraplex.platform.http_errors import error_response


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(
        self,
        app,
        max_bytes: int,
        *,
        prefix: str | None = None,
        path: str | None = None,
        method: str | None = None,
        message: str | None = None,
        param: str | None = None,
    ) -> None:
        self.app = app
        self.limit = max_bytes
        self.prefix, self.path, self.method = prefix, path, method
        self.message = message or f"the request body is larger than {max_bytes} bytes"
        self.param = param

    def _guards(self, scope) -> bool:
        if scope["type"] != "http" or (self.method is not None and scope["method"] != self.method):
            return False
        if self.path is not None:
            return scope["path"].rstrip("/") == self.path
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
