"""Ports and raw-socket HTTP probes (nothing reconnects or buffers behind the test's back)."""

from __future__ import annotations

import random
import socket


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
