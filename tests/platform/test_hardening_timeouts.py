"""Timeouts on a real ``loraplex serve`` process (small ``[limits]`` timeouts for the test): a
client that sends part of a body and then stalls gets 408 and its connection closed; an idle
keep-alive connection is closed by the server; sockets that connect and never send a byte, or
stall in the middle of their request headers, are closed while another tenant is served
normally. The assertions are on what the sockets see (a 408, then end of file or a reset) and
on counts, never on how long it took; the deadlines are only generous bounds."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest
from billing_helpers import auth, new_tenant

pytestmark = pytest.mark.slow  # a real `loraplex serve` process

ENV = {
    "LORAPLEX_LIMITS__BODY_TIMEOUT_S": "2",
    "LORAPLEX_LIMITS__IDLE_TIMEOUT_S": "1",
    "LORAPLEX_LIMITS__HEADER_TIMEOUT_S": "2",
}


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.settimeout(180)  # a generous bound: a server that never closes fails here, not a slow one
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (EOF or reset)."""
    got = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return got
        if not data:
            return got
        got += data


@pytest.fixture
def served(tmp_path, demo_model_dir, serve_process):
    return serve_process(tmp_path / "data", demo_model_dir, env=ENV, start_timeout=600)


def test_a_stalled_body_is_dropped_and_an_idle_connection_closed(served):
    _tid, key = new_tenant(served.url, "slow")

    # a slow writer: headers and part of the body, then nothing
    sock = _connect(served.url)
    sock.sendall(
        (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model": "x", "pro'
        ).encode()
    )
    answer = _read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"request_timeout" in answer

    # an idle keep-alive connection: one request answered, then silence; the server closes it
    sock = _connect(served.url)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
    answer = _read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert answer.count(b"HTTP/1.1") == 1  # the one answer, then the close

    # the server still serves after both
    sock = _connect(served.url)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _read_until_closed(sock).startswith(b"HTTP/1.1 200")
    sock.close()


def test_silent_and_stalled_header_sockets_are_closed_while_another_tenant_is_served(served):
    """Found by the hostile helper's slow-client attack: uvicorn arms no timer before the first
    request, and disarms its keep-alive timer on any byte, so a socket that never sends, or sends
    half a header, held its connection for ever (slowloris)."""
    _tid, key = new_tenant(served.url, "served-meanwhile")
    model = httpx.get(served.url + "/v1/models", headers=auth(key), timeout=120).json()["data"][0]["id"]
    silent = [_connect(served.url) for _ in range(10)]
    stalled = [_connect(served.url) for _ in range(10)]
    for i, sock in enumerate(stalled):  # the request line and half a header, then nothing
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bea{i}".encode())

    answers: dict[str, list[bytes]] = {"silent": [], "stalled": []}

    def drain(kind: str, socks: list[socket.socket]) -> None:
        for sock in socks:
            answers[kind].append(_read_until_closed(sock))
            sock.close()

    readers = [threading.Thread(target=drain, args=item) for item in (("silent", silent), ("stalled", stalled))]
    for t in readers:
        t.start()
    served_codes = []  # the other tenant meanwhile: every request answered normally
    while any(t.is_alive() for t in readers) or len(served_codes) < 3:
        r = httpx.post(
            served.url + "/v1/completions",
            headers=auth(key),
            json={"model": model, "prompt": "hello", "max_tokens": 2},
            timeout=180,
        )
        served_codes.append(r.status_code)
        assert len(served_codes) < 500, "the slow sockets were never closed"
    for t in readers:
        t.join(180)
    # every slow socket was closed by the server without an answer (nothing was asked of it)
    assert answers == {"silent": [b""] * 10, "stalled": [b""] * 10}
    assert set(served_codes) == {200}, served_codes
    assert served.proc.poll() is None
    assert "Traceback" not in served.output()
