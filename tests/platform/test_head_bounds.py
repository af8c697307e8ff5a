"""The request head's size bound (platform/http/head_deadline.py) on a real uvicorn with the protocol
``loraplex serve`` uses: httptools buffers a header of any length, so one endless header grew the
process by the client's bandwidth until the head deadline. A head over ``max_head_bytes`` gets 431
and the connection is closed, also when it is pipelined behind a request; bodies are not heads.
The oracle is how many bytes the kernel took from the client before the answer (a server that
buffers the header takes all of them)."""

from __future__ import annotations

import asyncio
import select
import socket
import time

import pytest
from harness.live import LiveServer

from loraplex.platform.http.head_deadline import RequestHeadDeadline

MAX_HEAD = 16 * 1024
STREAMED = 32 * 1024 * 1024  # what the client tries to send as one header
NOT_READ = 8 * 1024 * 1024


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    if scope["path"] == "/slow":
        await asyncio.sleep(3)  # an answer under way while the next head arrives
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(str(size)))]})
    await send({"type": "http.response.body", "body": str(size).encode()})


@pytest.fixture
def server():
    with LiveServer(_app, lifespan="off", http=RequestHeadDeadline.with_timeout(60, MAX_HEAD)) as srv:
        yield srv.port


def _stream(port: int, prefix: bytes, filler: bytes = b"a" * 65536) -> tuple[bytes, int]:
    """Send ``prefix`` then ``filler`` until the server answers or closes (or STREAMED is sent).
    Returns (everything received, bytes sent after the prefix)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sock.sendall(prefix)
    sock.setblocking(False)
    got, sent = b"", 0
    deadline = time.monotonic() + 120  # generous: a server that never refuses fails on `sent`
    try:
        while sent < STREAMED and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 0.5)
            if readable:
                data = sock.recv(65536)
                got += data
                if not data:
                    break
            elif writable:
                sent += sock.send(filler)
    except (ConnectionResetError, BrokenPipeError):
        pass  # the server closed while this side was still sending: what it answered may still be queued
    try:
        sock.setblocking(True)
        sock.settimeout(30)
        while data := sock.recv(65536):
            got += data
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        sock.close()
    return got, sent


def test_an_endless_header_gets_431_before_it_is_read(server):
    got, sent = _stream(server, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
    assert got.startswith(b"HTTP/1.1 431") and b"headers_too_large" in got, got[:300]
    assert sent < NOT_READ


def test_an_endless_request_line_gets_431(server):
    got, sent = _stream(server, b"GET /")
    assert got.startswith(b"HTTP/1.1 431"), got[:300]
    assert sent < NOT_READ


def test_an_endless_header_pipelined_behind_a_request_is_refused(server):
    got, sent = _stream(server, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nX-Big: ")
    assert got.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 431" in got, got[:300]
    assert sent < NOT_READ


def test_an_endless_header_while_an_answer_is_under_way_is_refused_after_it(server):
    got, sent = _stream(server, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nX-Big: ")
    assert sent < NOT_READ, got[:300]
    # the earlier request's answer whole, then the refusal (never written into the middle of it)
    assert got.startswith(b"HTTP/1.1 200") and got.index(b"HTTP/1.1 431") > got.index(b"\r\n\r\n0"), got[:400]


def test_large_bodies_and_heads_under_the_bound_are_served(server):
    body = b"z" * (4 * 1024 * 1024)
    head = f"POST / HTTP/1.1\r\nHost: x\r\nX-Ok: {'o' * (MAX_HEAD // 2)}\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server), timeout=60) as sock:
        for _ in range(3):  # keep-alive: each head is counted afresh
            sock.sendall(head.encode() + body)
            answer = b""
            while not answer.endswith(str(len(body)).encode()):
                data = sock.recv(65536)
                assert data, answer
                answer += data
            assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
