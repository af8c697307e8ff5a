"""An ASGI app on a real uvicorn in a thread of this process: the in-process server of the tests and
benchmarks (the app under test, its context and the session's engine stay reachable from the test).

``LiveServer(app, ctx=...)`` binds a free loopback port (port 0: the OS picks it, no race), waits
until uvicorn serves (polling, a generous deadline) and stops on ``stop()`` or at the end of a
``with``. ``http``: uvicorn's HTTP protocol class (e.g. the head-deadline protocol ``loraplex serve``
uses). For the real CLI in its own process, see ``serve.ServeProcess``.
"""

from __future__ import annotations

import threading
from typing import Any

from .wait import wait_for


class LiveServer:
    def __init__(
        self, app: Any, ctx: Any = None, *, http: Any = None, lifespan: str = "on", start_timeout: float = 120
    ) -> None:
        import uvicorn

        self.ctx = ctx
        options: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "log_level": "warning", "lifespan": lifespan}
        if http is not None:
            options["http"] = http
        self._server = uvicorn.Server(uvicorn.Config(app, **options))
        self._thread = threading.Thread(target=self._server.run, name="live-uvicorn", daemon=True)
        self._thread.start()
        wait_for(
            lambda: self._server.started,
            timeout=start_timeout,
            interval=0.02,
            what="uvicorn to serve",
            give_up=lambda: None if self._thread.is_alive() else "the server thread ended (see the log above)",
        )
        self.port: int = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 30) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
