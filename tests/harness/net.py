"""Ports and raw-socket HTTP probes (nothing reconnects or buffers behind the test's back)."""

from __future__ import annotations

import random
import select
import socket
import time
from collections.abc import Iterable


def free_port() -> int:
    """A free loopback port (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_below_ephemeral() -> int:
    """A free port in 20000-30000: below the kernel's ephemeral range (32768+) and above Ray's worker
    ports (10002-19999), so no process Ray starts can take it before our server binds it."""
    for _ in range(200):
        port = random.randint(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-30000")


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    return host, int(port)


def statuses_on_one_connection(url: str, path: str, token: str, n: int = 2) -> list[int | None]:
    """Send ``n`` GETs over ONE keep-alive connection; None where the server had closed the
    connection instead of answering."""
    host, port = _host_port(url)
    out: list[int | None] = []
    with socket.create_connection((host, port), timeout=15) as sock, sock.makefile("rb") as f:
        for _ in range(n):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
            status = f.readline()
            if not status:
                out.append(None)
                break
            length = 0
            while line := f.readline().strip():
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            f.read(length)
            out.append(int(status.split()[1]))
    return out


def status_before_body(
    url: str, path: str, headers: dict[str, str], content_length: int, sent: bytes = b"", timeout: float = 120
) -> int:
    """POST that announces ``content_length`` bytes but sends only ``sent`` (a prefix), then waits
    for the status line. A server that refuses on the announced size answers; one that reads the
    body first never does (the probe then fails after ``timeout``, a generous deadline, not a
    measurement). Returns the status code."""
    host, port = _host_port(url)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}Content-Length: {content_length}\r\n\r\n"
    with socket.create_connection((host, port), timeout=timeout) as sock, sock.makefile("rb") as f:
        sock.sendall(request.encode() + sent)
        try:
            status = f.readline()
        except TimeoutError:
            raise AssertionError(f"no answer before the body was sent ({content_length} bytes announced)") from None
    if not status:
        raise AssertionError("the server closed the connection without a status line")
    return int(status.split()[1])


class Answer:
    """What a raw-socket probe saw: the status (None: closed without one), how many body bytes the
    kernel took from us before the answer came, and whether the server then closed the connection."""

    def __init__(self, status: int | None, sent: int, closed: bool, raw: bytes) -> None:
        self.status, self.sent, self.closed, self.raw = status, sent, closed, raw

    def __repr__(self) -> str:
        return f"Answer(status={self.status}, sent={self.sent}, closed={self.closed}, raw={self.raw[:300]!r})"


def _status_of(raw: bytes) -> int | None:
    head = raw.split(b"\r\n", 1)[0].split()
    return int(head[1]) if len(head) >= 2 and head[1].isdigit() else None


def send_body(
    url: str,
    head: str,
    body: bytes | Iterable[bytes],
    *,
    chunked: bool = False,
    stall: bool = False,
    sndbuf: int = 64 * 1024,
    timeout: float = 120,
    wait_close: bool = True,
) -> Answer:
    """Send ``head`` (the request line and headers, without the blank line), then ``body`` (pieces
    sent as the socket accepts them; HTTP chunks when ``chunked``) while watching for an answer:
    sending stops the moment one arrives, and ``sent`` counts the body bytes the kernel had taken
    by then (a small send buffer keeps that close to what the server read). ``stall``: after the
    body pieces, send nothing more and wait (a client that stopped mid-body). Then reads the
    answer and waits (``timeout``, a generous deadline, not a measurement) for the server to close
    or keep the connection: ``closed`` is True if it closed it. ``wait_close=False``: return
    once the answer is read whole (by its Content-Length; ``closed`` then False), for tests that do
    not ask: telling a kept connection from a closed one costs 10 s of silence."""
    host, port = _host_port(url)
    pieces = iter([body] if isinstance(body, bytes) else body)
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.sendall(head.encode() + b"\r\n\r\n")
    sock.setblocking(False)
    raw, sent, pending, exhausted, broken = b"", 0, b"", False, False
    deadline = time.monotonic() + timeout
    try:
        while b"\r\n\r\n" not in raw and time.monotonic() < deadline:
            if not pending and not exhausted:
                piece = next(pieces, None)
                if piece is None:
                    exhausted = True
                    pending = b"0\r\n\r\n" if chunked and not stall else b""
                else:
                    pending = (f"{len(piece):x}\r\n".encode() + piece + b"\r\n") if chunked else piece
            writers = [sock] if pending and not broken else []
            readable, writable, _ = select.select([sock], writers, [], 0.5)
            if readable:
                data = sock.recv(65536)
                if not data:
                    break
                raw += data
            elif writable:
                try:
                    n = sock.send(pending[:65536])
                except (BrokenPipeError, ConnectionResetError):
                    broken = True  # the server closed its side: read what it said
                    continue
                sent += n
                pending = pending[n:]
        closed, raw = _read_to_close(sock, raw, deadline) if wait_close else _read_whole(sock, raw, deadline)
    except ConnectionResetError:
        closed = True
    finally:
        sock.close()
    return Answer(_status_of(raw), sent, closed, raw)


def _read_whole(sock: socket.socket, raw: bytes, deadline: float) -> tuple[bool, bytes]:
    """After the answer's head: read its body to its Content-Length (or to the close)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        None,
    )
    if length is None:
        return _read_to_close(sock, raw, deadline)
    sock.setblocking(True)
    while len(body) < length and time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            break
        if not data:
            return True, raw
        raw += data
        body += data
    return False, raw


def _read_to_close(sock: socket.socket, raw: bytes, deadline: float) -> tuple[bool, bytes]:
    """After the answer's head: whether the server closes the connection (before ``deadline``),
    and everything read."""
    sock.setblocking(True)
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, min(10.0, deadline - time.monotonic())))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return False, raw  # answered and kept open (keep-alive)
        except (ConnectionResetError, BrokenPipeError):
            return True, raw
        if not data:
            return True, raw
        raw += data
    return False, raw
