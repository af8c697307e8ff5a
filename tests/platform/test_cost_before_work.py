"""Cost before work (docs/limits.md), on a real uvicorn through raw sockets: a route that needs a
key answers 401 before it reads a byte of the body, whatever the body's framing; every body is
under a size limit and a deadline (a stalled or trickled body gets 408 and the connection is
closed); an upload is staged on disk only after the key was checked, and an oversize or stalled
one leaves no file. The oracle for "not read" is how many body bytes the kernel took from the
client before the answer came (a small send buffer keeps that near what the server read),
checked against a control that the same probe sees read whole."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
from harness.net import send_body
from harness.wait import wait_for
from platform_helpers import ADMIN_KEY

BIG = 512 * 1024 * 1024  # limits this large: only the key check can stop the probes below
BODY = 48 * 1024 * 1024  # what the attacker sends
PIECE = b"x" * (256 * 1024)
NOT_READ = 8 * 1024 * 1024  # socket buffers hold far less than this; a server that reads takes it all


def _pieces(total: int = BODY):
    for _ in range(total // len(PIECE)):
        yield PIECE


def _head(url: str, path: str, *headers: str) -> str:
    host = url.removeprefix("http://")
    return "\r\n".join([f"POST {path} HTTP/1.1", f"Host: {host}", *headers])


def _multipart_head(url: str, key: str | None, boundary: str = "b0undary", length: int | None = None) -> str:
    extra = [f"Authorization: Bearer {key}"] if key else []
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return _head(url, "/admin/v1/adapters", f"Content-Type: multipart/form-data; boundary={boundary}", framing, *extra)


def _multipart_start(boundary: str = "b0undary") -> bytes:
    return (
        f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nbig\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="visibility"\r\n\r\nshared\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.zip"\r\n'
        "Content-Type: application/zip\r\n\r\n"
    ).encode()


def _staged(live) -> list[Path]:
    """What lies under the staging root now. The server may remove a staging folder while this walks
    it (the walk then raises FileNotFoundError on this Python): that is a moment of change, so walk
    again rather than fail."""
    root = live.ctx.store.staging_root
    for _ in range(100):
        try:
            return sorted(root.rglob("*")) if root.exists() else []
        except FileNotFoundError:
            continue
    raise AssertionError(f"{root} kept changing under 100 walks")


def _open_files_under(*folders: Path) -> list[str]:
    """Files this process (the in-thread server) holds open under ``folders``, deleted ones too
    (an anonymous spool file shows as '/tmp/#123 (deleted)')."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if any(target.startswith(str(f)) for f in folders):
            out.append(target)
    return out


@pytest.fixture
def wide_open(live_factory):
    """Limits far above the probes: a refusal can come only from the key check."""
    return live_factory(
        limits={"max_body_bytes": BIG, "max_admin_body_bytes": BIG, "body_timeout_s": 300},
        uploads={"max_upload_bytes": BIG, "upload_timeout_s": 300},
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "ctype"),
    [
        ("/admin/v1/adapters", "application/json"),  # the route of the 5.8 GB report
        ("/admin/v1/adapters", "multipart/form-data; boundary=b0undary"),
        ("/admin/v1/tenants", "application/json"),
        ("/v1/load_lora_adapter", "application/json"),
        ("/v1/chat/completions", "application/json"),
        ("/tokenize", "application/json"),
    ],
)
def test_no_key_is_answered_before_the_body_is_read(wide_open, path, ctype):
    url = wide_open.url
    for auth in ([], ["Authorization: Bearer lpx-wrong-key"], ["Authorization: Basic Zm9vOmJhcg=="]):
        for framing in ("Transfer-Encoding: chunked", f"Content-Length: {BODY}"):
            chunked = framing.startswith("Transfer")
            answer = send_body(
                url, _head(url, path, f"Content-Type: {ctype}", framing, *auth), _pieces(), chunked=chunked
            )
            assert answer.status == 401, (path, auth, framing, answer)
            assert answer.sent < NOT_READ, (path, auth, framing, answer)
            assert answer.closed, answer  # the announced body is never read after the answer either
            assert json.loads(answer.raw.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "authentication_error"
    assert not _staged(wide_open)


@pytest.mark.slow
def test_the_probe_sees_an_authenticated_body_read_whole(wide_open):
    """The control: the same probe with the admin key, on the upload route, sees every byte taken."""
    url = wide_open.url
    body = [_multipart_start(), *_pieces(16 * 1024 * 1024), b"\r\n--b0undary--\r\n"]
    answer = send_body(url, _multipart_head(url, ADMIN_KEY), body, chunked=True)
    assert answer.status == 400, answer  # junk, not an archive: refused after reading it
    assert answer.sent >= 16 * 1024 * 1024
    wait_for(lambda: not _staged(wide_open), what="the staged upload is removed", timeout=60)


@pytest.mark.slow
def test_a_tenant_key_on_the_admin_api_is_refused_before_the_body(wide_open):
    from billing_helpers import new_tenant

    _tid, key = new_tenant(wide_open.url, "t")
    url = wide_open.url
    answer = send_body(url, _multipart_head(url, key), [_multipart_start(), *_pieces()], chunked=True)
    assert answer.status == 403 and answer.sent < NOT_READ, answer
    assert not _staged(wide_open)


@pytest.mark.slow
def test_unauthenticated_uploads_stage_nothing_anywhere(wide_open):
    """Four at once, stalled mid-body: nothing of theirs reaches the staging folder or a temp file."""
    url = wide_open.url
    answers: list = []
    spools = (wide_open.ctx.store.staging_root, Path(tempfile.gettempdir()) / "#")
    before = set(_open_files_under(*spools))  # the session's engine may hold some of its own

    def one() -> None:
        body = [_multipart_start(), *_pieces(4 * 1024 * 1024)]
        answers.append(send_body(url, _multipart_head(url, None, length=BODY), body, stall=True))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [a.status for a in answers] == [401] * 4, answers
    assert all(a.sent < NOT_READ for a in answers), answers
    assert not _staged(wide_open)
    assert set(_open_files_under(*spools)) <= before


@pytest.fixture
def tight(live_factory):
    """Small limits and timeouts, so every bound is reached quickly."""
    return live_factory(
        limits={
            "max_body_bytes": 64 * 1024,
            "max_admin_body_bytes": 8 * 1024,
            "body_timeout_s": 60,
            "body_idle_timeout_s": 1,
        },
        uploads={
            "max_upload_bytes": 256 * 1024,
            "upload_timeout_s": 3,
            "max_members": 8,
            "max_unpacked_bytes": 1 << 20,
        },
    )


@pytest.mark.slow
@pytest.mark.parametrize("route", ["admin", "tenant", "upload"])
def test_a_body_that_stops_arriving_gets_408_and_the_connection_closed(tight, route):
    from billing_helpers import new_tenant

    url = tight.url
    if route == "upload":
        head = _multipart_head(url, ADMIN_KEY, length=200 * 1024)
        first = [_multipart_start(), b"PK" * 100]
    elif route == "admin":
        head = _head(
            url,
            "/admin/v1/tenants",
            "Content-Type: application/json",
            "Content-Length: 1000",
            f"Authorization: Bearer {ADMIN_KEY}",
        )
        first = [b'{"name": "sl']
    else:
        _tid, key = new_tenant(url, "slow")
        head = _head(
            url,
            "/v1/completions",
            "Content-Type: application/json",
            "Content-Length: 1000",
            f"Authorization: Bearer {key}",
        )
        first = [b'{"model": "x", "prompt": "']
    answer = send_body(url, head, first, stall=True)
    assert answer.status == 408 and answer.closed, answer
    assert b"request_timeout" in answer.raw
    wait_for(lambda: not _staged(tight), what="the stalled upload's staged file is removed", timeout=60)


@pytest.mark.slow
def test_an_upload_trickled_without_pauses_meets_its_deadline(tight):
    """A byte every 0.1 s never pauses over the idle timeout; the whole-upload deadline ends it."""
    url = tight.url

    def trickle():
        yield _multipart_start()
        for _ in range(100_000):
            time.sleep(0.1)
            yield b"P"

    answer = send_body(url, _multipart_head(url, ADMIN_KEY, length=200 * 1024), trickle())
    assert answer.status == 408 and answer.closed, answer
    wait_for(lambda: not _staged(tight), what="the trickled upload's staged file is removed", timeout=60)


@pytest.mark.slow
def test_many_slow_uploads_at_once_all_end_and_leave_nothing(tight):
    url = tight.url
    answers: list = []

    def one() -> None:
        body = [_multipart_start(), b"PK" * 1000]
        answers.append(send_body(url, _multipart_head(url, ADMIN_KEY, length=200 * 1024), body, stall=True))

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert sorted(a.status for a in answers) == [408] * 12, answers
    wait_for(lambda: not _staged(tight), what="every staged upload is removed", timeout=60)


@pytest.fixture
def capped(live_factory):
    """A small upload cap with generous timeouts (a loaded machine never pauses a sender for long)."""
    return live_factory(
        limits={"body_timeout_s": 300, "body_idle_timeout_s": 60},
        uploads={
            "max_upload_bytes": 256 * 1024,
            "upload_timeout_s": 300,
            "max_members": 8,
            "max_unpacked_bytes": 1 << 20,
        },
    )


@pytest.mark.slow
@pytest.mark.parametrize("framing", ["declared", "chunked", "lying"])
def test_an_oversize_authenticated_upload_is_413_and_leaves_no_file(capped, framing):
    tight = capped
    url = tight.url
    body = [_multipart_start(), *([b"z" * 65536] * 8), b"\r\n--b0undary--\r\n"]  # 512 KiB > 256 KiB
    size = sum(len(b) for b in body)
    if framing == "declared":
        head = _multipart_head(url, ADMIN_KEY, length=size)
    elif framing == "lying":  # announces less than the cap, sends more: the surplus is not a body
        head = _multipart_head(url, ADMIN_KEY, length=100 * 1024)
    else:
        head = _multipart_head(url, ADMIN_KEY)
    answer = send_body(url, head, body, chunked=framing == "chunked")
    if framing == "lying":  # the body ends where announced: a truncated form, never a stored file
        assert answer.status == 400, answer
    else:
        assert answer.status == 413 and answer.closed, answer
        assert b"payload_too_large" in answer.raw
    wait_for(lambda: not _staged(tight), what="the oversize upload's staged file is removed", timeout=60)
    assert not _open_files_under(tight.ctx.store.staging_root)
    assert tight.ctx.store.stored_paths() == []


@pytest.mark.slow
def test_expect_100_continue_without_a_key_gets_401_not_continue(wide_open):
    url = wide_open.url
    head = _head(
        url, "/admin/v1/adapters", "Content-Type: application/json", f"Content-Length: {BODY}", "Expect: 100-continue"
    )
    answer = send_body(url, head, [], stall=True)
    assert answer.status == 401 and answer.closed, answer
    assert b"100 Continue" not in answer.raw


@pytest.mark.slow
def test_a_request_hidden_in_an_unread_body_is_never_served(wide_open):
    """Pipelining: the body of a refused request is not read as the next request (no smuggling)."""
    url = wide_open.url
    host = url.removeprefix("http://")
    hidden = f"DELETE /admin/v1/tenants/x HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN_KEY}\r\n\r\n"
    head = _head(url, "/admin/v1/tenants", "Content-Type: application/json", f"Content-Length: {len(hidden)}")
    answer = send_body(url, head, [hidden.encode() + f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()])
    assert answer.status == 401 and answer.closed, answer
    assert answer.raw.count(b"HTTP/1.1 ") == 1, answer  # one answer: neither the hidden nor the next


@pytest.mark.slow
def test_a_gzip_body_is_not_inflated(live_factory):
    """No request decompression anywhere: a gzip bomb is a small invalid body, never 1 GB of JSON."""
    from billing_helpers import new_tenant

    live = live_factory()
    _tid, key = new_tenant(live.url, "gz")
    bomb = gzip.compress(b"[" + b" " * (64 * 1024 * 1024) + b"]")
    valid = json.dumps({"model": live.ctx.engine.model_name, "prompt": "hi", "max_tokens": 1}).encode()
    for body in (bomb, gzip.compress(valid)):
        url = live.url
        head = _head(
            url,
            "/v1/completions",
            "Content-Type: application/json",
            "Content-Encoding: gzip",
            f"Content-Length: {len(body)}",
            f"Authorization: Bearer {key}",
        )
        answer = send_body(url, head, body, wait_close=False)  # whether it closes is not the point here
        # 400 even for the valid request inside: the bytes were parsed as they are, never inflated
        assert answer.status == 400 and b'"error"' in answer.raw, answer
