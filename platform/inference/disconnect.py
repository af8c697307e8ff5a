"""A client that leaves stops its work, streaming or not.

A streaming response notices the disconnect itself (Starlette cancels it). A non-streaming one is
computing its whole answer while nobody reads the socket, so ``DisconnectWatch`` (ASGI) listens for
``http.disconnect`` once the body has arrived and runs the hooks the request registered on its
``ClientWatch`` (``generation.start`` registers an engine abort): the sequences stop at the
engine's next step and the request is billed for what was generated up to then."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextvars import ContextVar

_current: ContextVar[ClientWatch | None] = ContextVar("loraplex_client_watch", default=None)


class ClientWatch:
    def __init__(self) -> None:
        self.gone = False
        self._hooks: list[Callable[[], None]] = []

    def on_gone(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` when the client disconnects (now, if it already has)."""
        if self.gone:
            hook()
        else:
            self._hooks.append(hook)

    def fire(self) -> None:
        if self.gone:
            return
        self.gone = True
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()


def current() -> ClientWatch | None:
    """The watch of the HTTP request being served (None outside DisconnectWatch: tests, CLI)."""
    return _current.get()


class DisconnectWatch:
    def __init__(self, app, prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.prefixes = prefixes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith(self.prefixes):
            return await self.app(scope, receive, send)
        watch = ClientWatch()
        body_done = asyncio.Event()

        async def tracking_receive():
            message = await receive()
            if message["type"] == "http.disconnect":
                watch.fire()
            elif not message.get("more_body", False):
                body_done.set()
            return message

        async def listen() -> None:
            await body_done.wait()  # never read the socket while the route is still reading the body
            while (await receive())["type"] != "http.disconnect":
                pass
            watch.fire()

        token = _current.set(watch)
        listener = asyncio.create_task(listen())
        try:
            await self.app(scope, tracking_receive, send)
        finally:
            _current.reset(token)
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
