"""A deadline for the request head: a connection that sends nothing, or stalls in the middle of its
request line or headers (slowloris), is closed.

uvicorn arms its keep-alive timer only after a response, and disarms it on any byte received, so a
socket that connects and never writes, or writes half a header and stops, would hold a connection
(and a file descriptor) for ever. The body has its own deadline (``BodyTimeout``, a 408); this
covers what comes before it.

``RequestHeadDeadline`` wraps uvicorn's own HTTP protocol (composition: every call is forwarded
unchanged) and looks at it every ``timeout_s``: while the connection waits for a request head (no
request yet, or the last response is complete) and no new head has arrived since the previous
look, it is closed. A head that does not arrive whole is therefore dropped after one to two
``timeout_s``; a request being read or answered is never touched.

The head's size is bounded the same way: uvicorn's httptools parser buffers a request line or a
header of any length (it never refuses one), so a client streaming one endless header would grow
the process by its bandwidth for the whole deadline. Bytes received while a head is expected (no
request yet, the last one's body complete, pipelined or not) are counted, and a head that is not
complete after ``max_head_bytes`` is answered 431 (when no response is under way) and closed.

The close lingers (as nginx's ``lingering_close`` does): closing a socket whose receive buffer
still holds the client's unread bytes makes the kernel answer with a reset, and a client still
sending its header can lose the 431 to it. So the write side is shut first and what the client
goes on sending is dropped unread, for at most ``LINGER_BYTES`` or ``LINGER_S``, then closed."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.importer import import_from_string

_AUTO = "uvicorn.protocols.http.auto:AutoHTTPProtocol"  # httptools if installed, else h11


_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_TOO_LARGE_BODY = (
    b'{"error":{"message":"the request line and headers are too large","type":"invalid_request_error",'
    b'"param":null,"code":"headers_too_large"}}'
)


LINGER_BYTES = 256 * 1024  # dropped after the 431 before the close, so the reset cannot overtake it
LINGER_S = 2.0


class RequestHeadDeadline(asyncio.Protocol):
    timeout_s: float = 10.0
    max_head_bytes: int = 64 * 1024

    def __init__(self, **kwargs: Any) -> None:
        inner_class = import_from_string(_AUTO)
        self.inner: Any = inner_class(**kwargs)
        self._loop = kwargs.get("_loop") or asyncio.get_event_loop()
        self._seen: object = None  # the request cycle at the previous look
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.BaseTransport | None = None
        self.closed_idle = False
        self._head_bytes = 0  # received since a head was last expected
        self._refusing = False
        self._lingered = -1  # bytes dropped after the 431 (-1: not answered yet)

    @classmethod
    def with_timeout(cls, timeout_s: float, max_head_bytes: int = 64 * 1024) -> type[RequestHeadDeadline]:
        return type(cls.__name__, (cls,), {"timeout_s": timeout_s, "max_head_bytes": max_head_bytes})

    # -- the deadline --------------------------------------------------------------------------
    def _look(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        cycle = getattr(self.inner, "cycle", None)
        # after a response uvicorn's own keep-alive timer (limits.idle_timeout_s) governs, until a
        # byte of the next request disarms it
        keep_alive = getattr(self.inner, "timeout_keep_alive_task", None) is not None
        waiting_for_head = cycle is None or (bool(getattr(cycle, "response_complete", False)) and not keep_alive)
        if waiting_for_head and cycle is self._seen:
            self.closed_idle = True
            transport.close()  # nothing was promised to this client: no answer, just the close
            return
        self._seen = cycle
        self._timer = self._loop.call_later(self.timeout_s, self._look)

    # -- asyncio.Protocol, forwarded -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self.inner.connection_made(transport)
        self._timer = self._loop.call_later(self.timeout_s, self._look)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusing:
            if self._lingered < 0:
                return  # an oversize head: the rest of it is dropped unread until the 431 is out
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES and self._transport is not None:
                self._transport.close()
            return
        while data:
            transport = self._transport
            if transport is None or transport.is_closing():
                return
            cycle = getattr(self.inner, "cycle", None)
            if cycle is not None and getattr(cycle, "more_body", False):
                self.inner.data_received(data)  # a body being read: BodyGuard bounds it
                return
            room = self.max_head_bytes - self._head_bytes
            if room <= 0:
                self._refusing = True
                self._transport.pause_reading()  # type: ignore[union-attr]
                self._refuse_head()
                return
            piece, data = data[:room], data[room:]
            self._head_bytes += len(piece)
            self.inner.data_received(piece)
            if getattr(self.inner, "cycle", None) is not cycle:
                self._head_bytes = 0  # a head completed inside ``piece``: count the next one afresh

    def _refuse_head(self) -> None:
        """431 and close, once the answer to an earlier (pipelined) request is out."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        cycle = getattr(self.inner, "cycle", None)
        if cycle is not None and not getattr(cycle, "response_complete", False):
            self._loop.call_later(0.05, self._refuse_head)
            return
        transport.write(_TOO_LARGE % (len(_TOO_LARGE_BODY), _TOO_LARGE_BODY))  # type: ignore[attr-defined]
        if not transport.can_write_eof():  # type: ignore[attr-defined]
            transport.close()
            return
        transport.write_eof()  # type: ignore[attr-defined]
        self._lingered = 0
        transport.resume_reading()  # type: ignore[attr-defined]
        self._loop.call_later(LINGER_S, transport.close)

    def eof_received(self) -> bool | None:
        if self._refusing:  # the client stopped sending: close once the 431 is out
            return self._lingered < 0
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
