"""ASGI guard for the tenant API: a request body over the limit gets 413 before it is read whole
(declared Content-Length first; a chunked body is counted as it arrives)."""

from __future__ import annotations

from loraplex.platform.http_errors import error_response


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app, prefix: str, max_bytes: int) -> None:
        self.app = app
        self.prefix = prefix
        self.limit = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
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
            413,
            f"the request body is larger than {self.limit} bytes",
            code="payload_too_large",
            headers={"connection": "close"},
        )
        await response(scope, receive, send)
