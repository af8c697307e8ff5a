"""``x-request-id`` (platform/http/request_id.py) through a real server: made by the server when the
client sent none (OpenAI's ``req_`` shape, what the SDK exposes as ``_request_id``), the client's own
when valid, replaced (never echoed) when hostile; on refusals of every guard too; the same id in
every usage record of the request (one per prompt) and on uvicorn's access log line."""

from __future__ import annotations

import logging
import re
import threading
import time

import httpx
import pytest
import uvicorn
from harness.net import free_port
from sqlalchemy import select

from loraplex.platform.http import access_log
from loraplex.platform.http.request_id import RequestId
from loraplex.platform.usage.models import UsageRecord

pytestmark = pytest.mark.timeout(300)
GENERATED = re.compile(r"req_[0-9a-f]{32}")


def _records(ctx, tenant_id: str) -> list[UsageRecord]:
    ctx.ledger.flush()
    with ctx.sessions() as s:
        return list(s.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id)))


def test_request_id_generated_echoed_or_replaced_and_in_usage(tenant_setup):
    ctx, url, tid, key, _ada, client = tenant_setup
    base = ctx.engine.model_name
    msgs = [{"role": "user", "content": "hi"}]
    raw = client.chat.completions.with_raw_response.create(model=base, messages=msgs, max_tokens=2)
    made = raw.headers["x-request-id"]
    assert GENERATED.fullmatch(made) and raw.parse()._request_id == made
    again = client.chat.completions.with_raw_response.create(model=base, messages=msgs, max_tokens=2)
    assert again.headers["x-request-id"] != made  # one per request
    # the client's valid id is kept: in the header, the SDK's view, every record of the request
    mine = "trace-7.a_b:C"
    two = client.completions.with_raw_response.create(
        model=base, prompt=["a", "b"], max_tokens=2, extra_headers={"X-Request-Id": mine}
    )
    assert two.headers["x-request-id"] == mine and len(two.parse().choices) == 2
    streamed = client.chat.completions.with_raw_response.create(
        model=base, messages=msgs, max_tokens=2, stream=True, extra_headers={"x-request-id": "s-1"}
    )
    assert streamed.headers["x-request-id"] == "s-1"
    list(streamed.parse())
    by_id: dict[str | None, int] = {}
    for r in _records(ctx, tid):
        by_id[r.http_request_id] = by_id.get(r.http_request_id, 0) + 1
    assert by_id == {made: 1, again.headers["x-request-id"]: 1, mine: 2, "s-1": 1}
    # hostile ids are replaced by a new one, never echoed or stored
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": base, "prompt": "x", "max_tokens": 1}
    for bad in ["has space", "x" * 129, "", "a\tb", "a,b", "caf\u00e9".encode(), "<script>"]:
        r = httpx.post(url + "/v1/completions", headers={**headers, "x-request-id": bad}, json=body, timeout=60)
        assert r.status_code == 200 and GENERATED.fullmatch(r.headers["x-request-id"]), (bad, r.headers)
    r = httpx.post(
        url + "/v1/completions",
        headers=[("authorization", f"Bearer {key}"), ("x-request-id", "a"), ("x-request-id", "b")],
        json=body,
        timeout=60,
    )
    assert GENERATED.fullmatch(r.headers["x-request-id"]) and r.headers.get_list("x-request-id") == [
        r.headers["x-request-id"]
    ]
    stored = {r.http_request_id for r in _records(ctx, tid)}
    assert all(s is None or GENERATED.fullmatch(s) or s in (mine, "s-1") for s in stored)


def test_every_refusal_carries_a_request_id(tenant_setup):
    ctx, url, _tid, key, _ada, _client = tenant_setup
    base = ctx.engine.model_name
    cases = [
        ("POST", "/v1/chat/completions", {"authorization": "Bearer nope"}, b"{}"),  # the key gate: 401
        ("GET", "/v1/no-such-route", {"authorization": f"Bearer {key}"}, b""),  # 404
        ("POST", "/v1/completions", {"authorization": f"Bearer {key}"}, b"{not json"),  # 400
        ("POST", "/v1/completions", {"authorization": f"Bearer {key}"}, b'{"prompt": "\\ud800"}'),  # text guard
        ("POST", "/v1/completions", {"authorization": f"Bearer {key}"}, b'{"model": "m", "prompt": 5}'),  # schema
    ]
    for method, path, headers, content in cases:
        r = httpx.request(
            method, url + path, headers={**headers, "x-request-id": "refused-1"}, content=content, timeout=60
        )
        assert r.status_code >= 400 and r.headers["x-request-id"] == "refused-1", (path, r.status_code)
    ok = httpx.post(
        url + "/v1/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": base, "prompt": "x", "max_tokens": 1},
        timeout=60,
    )
    assert ok.status_code == 200


async def _hello(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-request-id", b"spoofed")]})
    await send({"type": "http.response.body", "body": b"hi"})


def test_access_log_line_names_the_request_id():
    """On a real uvicorn with its own logging set up (as ``loraplex serve`` does): the access line
    ends with the id the response carried; an inner app cannot set a second, spoofed one."""
    port = free_port()
    config = uvicorn.Config(RequestId(_hello), host="127.0.0.1", port=port, log_level="info", lifespan="off")
    server = uvicorn.Server(config)
    config.load()  # sets up uvicorn's loggers; the filter and format go after, as in cli.serve
    access_log.install()
    logger = logging.getLogger("uvicorn.access")
    lines: list[str] = []
    formatter = next(h.formatter for h in logger.handlers if h.formatter is not None)

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(formatter.format(record))

    capture = Capture()
    logger.addHandler(capture)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        given = httpx.get(f"http://127.0.0.1:{port}/x?key=secret", headers={"x-request-id": "log-me-1"})
        made = httpx.get(f"http://127.0.0.1:{port}/y")
        assert given.headers.get_list("x-request-id") == ["log-me-1"]
        assert GENERATED.fullmatch(made.headers["x-request-id"])
        deadline = time.monotonic() + 30
        while len(lines) < 2:
            assert time.monotonic() < deadline, lines
            time.sleep(0.02)
    finally:
        server.should_exit = True
        thread.join(15)
        logger.removeHandler(capture)
        for f in list(logger.filters):
            logger.removeFilter(f)
    assert lines[0].endswith("request_id=log-me-1") and "secret" not in lines[0], lines
    assert lines[1].endswith(f"request_id={made.headers['x-request-id']}"), lines
