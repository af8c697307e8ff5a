"""Which server a request belongs to: the routes are shared by every app of a process
(``app.api_app``), so the ``PlatformContext`` travels with the request instead, in its ASGI
``state`` (``request.state.ctx``, read by ``deps.get_context``)."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send


class BindContext:
    """Pure ASGI: puts ``ctx`` into every HTTP and WebSocket request's state."""

    def __init__(self, app: ASGIApp, ctx: Any) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope.setdefault("state", {})["ctx"] = self.ctx
        await self.app(scope, receive, send)
