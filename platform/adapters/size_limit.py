"""ASGI guard for the upload route: a body over the limit gets 413 before it is spooled to disk."""

from __future__ import annotations

from loraplex.platform.http_errors import error_response

# Room for the multipart envelope and the small form fields around the file.
MULTIPART_OVERHEAD = 64 * 1024


class _TooLarge(Exception):
    pass


class UploadSizeLimit:
    def __init__(self, app, path: str, max_bytes: int) -> None:
        self.app = app
        self.path = path
        self.limit = max_bytes + MULTIPART_OVERHEAD

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != self.path:
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._refuse(scope, receive, send)
        seen = 0
        exceeded = False

        async def counting_receive():
            nonlocal seen, exceeded
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                exceeded = True
                raise _TooLarge()
            return message

        async def guarded_send(message):
            if not exceeded:
                await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _TooLarge:
            pass
        except Exception:
            if not exceeded:
                raise
        if exceeded:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send):
        response = error_response(
            413,
            f"the upload is larger than {self.limit - MULTIPART_OVERHEAD} bytes",
            param="file",
            code="payload_too_large",
            headers={"connection": "close"},
        )
        await response(scope, receive, send)
