"""One tenant's hostile input never hurts another's request or the ledger.

- A lone UTF-16 surrogate anywhere in a JSON body (``user``, tool-call arguments, names, admin
  fields) is a 400 naming where it is, before anything is reserved or written.
- The usage writer answers every waiter whatever exception a batch raises: with arbitrary
  exceptions injected into its commits under concurrent load, no request hangs, no concurrency slot
  stays taken, and every request's final record is in the database or in usage.rejected.jsonl.
- A non-streaming client that disconnects stops its sequences and is billed for what was generated."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

import httpx
import pytest
from billing_helpers import H, auth, new_tenant, usage_rows
from harness.wait import wait_for

from loraplex.platform.usage.spool import REJECTED

SURROGATE = "\ud800"


def _raw(obj) -> bytes:
    return json.dumps(obj).encode()  # ensure_ascii: the surrogate travels as a \ud800 escape


@pytest.fixture
def live(live_factory):
    return live_factory()


def _bodies(model: str) -> list[tuple[str, dict, str]]:
    msg = [{"role": "user", "content": "hi"}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "x' + SURROGATE + '"}'}}
    return [
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2, "user": SURROGATE}, "user"),
        ("/v1/chat/completions", {"model": model, "messages": msg, "max_tokens": 2, "user": "a" + SURROGATE}, "user"),
        (
            "/v1/chat/completions",
            {"model": model, "messages": [*msg, {"role": "assistant", "tool_calls": [call]}], "max_tokens": 2},
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "hi", "name": SURROGATE}], "max_tokens": 2},
            "messages[0].name",
        ),
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2, "stop": ["\udfff"]}, "stop[0]"),
        ("/tokenize", {"model": model, "prompt": "x" + SURROGATE}, "prompt"),
        ("/detokenize", {"model": model, "tokens": [1], SURROGATE: 1}, "body"),
    ]


def test_a_lone_surrogate_anywhere_is_a_400_before_anything_is_reserved(live):
    tid, key = new_tenant(live.url, "hostile", quota={"rpm": 100})
    model = live.ctx.engine.model_name
    with httpx.Client(base_url=live.url, timeout=60) as c:
        for path, body, where in _bodies(model):
            r = c.post(path, content=_raw(body), headers={**auth(key), "content-type": "application/json"})
            assert r.status_code == 400, (path, where, r.text)
            err = r.json()["error"]
            assert err["code"] == "invalid_text" and err["param"] == where, err
            assert "a lone UTF-16 surrogate" in err["message"] and "NUL" not in err["message"], err
        # raw CESU-8 bytes of a surrogate decode to one too (json.loads uses surrogatepass)
        raw = b'{"model": "' + model.encode() + b'", "prompt": "hi", "max_tokens": 2, "user": "\xed\xa0\x80"}'
        r = c.post("/v1/completions", content=raw, headers={**auth(key), "content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text"
        # the admin API: a tenant name never reaches storage
        r = c.post("/admin/v1/tenants", content=_raw({"name": "evil" + SURROGATE}), headers=H)
        assert r.status_code == 400 and r.json()["error"]["param"] == "name"
        # a valid surrogate *pair* (an emoji, escaped) is fine
        ok = {"model": model, "prompt": "hi \ud83d\ude00", "max_tokens": 2, "user": "\ud83d\ude00"}
        r = c.post("/v1/completions", content=_raw(ok), headers={**auth(key), "content-type": "application/json"})
        assert r.status_code == 200, r.text
    now = live.ctx.quotas.usage_now(tid)
    assert now["requests_last_minute"] == 1 and now["running"] == 0  # only the valid one counted
    live.ctx.ledger.flush()
    rows = usage_rows(live.url, tid)
    assert len(rows) == 1 and next(iter(rows.values()))["user"] == "\U0001f600"


def _spellings(body: dict) -> list[tuple[str, list[tuple[str, str]], bytes]]:
    """The same JSON body as FastAPI would still parse it, in spellings a byte-level guard can miss
    (found by a hostile run: each carried a lone surrogate past the guard, served, then unbillable)."""
    raw = _raw(body)
    return [
        ("uppercase media type", [("content-type", "APPLICATION/JSON")], raw),
        ("mixed-case media type", [("content-type", "Application/Json; charset=utf-8")], raw),
        ("utf-16 body", [("content-type", "application/json")], json.dumps(body).encode("utf-16")),
        ("utf-16-le body", [("content-type", "application/json")], json.dumps(body).encode("utf-16-le")),
        ("utf-32 body", [("content-type", "application/json")], json.dumps(body).encode("utf-32")),
        (
            "json, then a second content type",
            [("content-type", "application/json"), ("content-type", "text/plain")],
            raw,
        ),
        ("no content type", [], raw),
    ]


@pytest.mark.parametrize("spelling", range(7))
def test_bad_text_is_refused_whatever_the_body_spelling(live, spelling):
    tid, key = new_tenant(live.url, "spelling")
    model = live.ctx.engine.model_name
    bad = (
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2, "user": "x" + SURROGATE}, "surrogate"),
        ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2, "user": "x\u0000"}, "NUL"),
        ("/admin/v1/tenants", {"name": "evil" + SURROGATE}, "surrogate"),
    )
    with httpx.Client(base_url=live.url, timeout=120) as c:
        for path, body, cause in bad:
            label, headers, content = _spellings(body)[spelling]
            who = H if path.startswith("/admin") else auth(key)
            r = c.post(path, content=content, headers=[*headers, *who.items()])
            assert r.status_code == 400, (label, path, r.text)
            err = r.json()["error"]
            assert err["code"] == "invalid_text" and cause in err["message"], (label, err)
        # the same spelling with storable text passes the guard: it refuses text, not spellings
        # (without a content type the route itself wants a JSON body: its own 400, not the guard's)
        label, headers, content = _spellings({"model": model, "prompt": "hi", "max_tokens": 2, "user": "ok"})[spelling]
        r = c.post("/v1/completions", content=content, headers=[*headers, *auth(key).items()])
        served = bool(headers)
        assert r.status_code == (200 if served else 400), (label, r.text)
        assert served or r.json()["error"]["code"] != "invalid_text", r.text
    live.ctx.ledger.flush()
    assert len(usage_rows(live.url, tid)) == int(served)  # only a storable one was served, and billed


class _Flaky:
    """Wraps the ledger's commit: raises an arbitrary exception for some batches and some rows."""

    KINDS = (
        lambda: UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
        lambda: ValueError("bad value"),
        lambda: RuntimeError("driver bug"),
        lambda: KeyError("column"),
        lambda: TypeError("not serializable"),
    )

    def __init__(self, commit, rate: float, seed: int) -> None:
        self.commit = commit
        self.rate = rate
        self.rng = random.Random(seed)
        self.raised = 0

    def __call__(self, rows):
        if self.rng.random() < self.rate:
            self.raised += 1
            raise self.rng.choice(self.KINDS)()
        return self.commit(rows)


def test_writer_answers_every_waiter_whatever_a_batch_raises(live):
    ledger = live.ctx.ledger
    flaky = _Flaky(ledger._commit, rate=0.3, seed=7)
    ledger._commit = flaky  # type: ignore[method-assign]
    model = live.ctx.engine.model_name
    tenants = [new_tenant(live.url, f"t{i}", quota={"max_concurrent": 4}) for i in range(2)]

    async def one(c: httpx.AsyncClient, key: str, i: int) -> tuple[int, str | None]:
        body = {"model": model, "prompt": f"Story {i}", "max_tokens": 6, "n": 1 + i % 3, "stream": i % 2 == 0}
        r = await c.post("/v1/completions", json=body, headers=auth(key))
        if r.status_code != 200:
            return r.status_code, None
        if body["stream"]:
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            return 200, events[0]["id"].removeprefix("cmpl-")
        return 200, r.json()["id"].removeprefix("cmpl-")

    async def load():
        async with httpx.AsyncClient(base_url=live.url, timeout=120) as c:
            jobs = [one(c, key, i) for i in range(30) for _tid, key in tenants]
            return await asyncio.wait_for(asyncio.gather(*jobs), timeout=240)  # a hang fails here

    results = asyncio.run(load())
    assert flaky.raised > 0
    assert {s for s, _ in results} <= {200, 429}
    done_ids = {rid for s, rid in results if s == 200}
    assert len(done_ids) >= 4
    ledger._commit = flaky.commit  # type: ignore[method-assign]
    ledger.flush()
    for tid, _key in tenants:
        assert live.ctx.quotas.running(tid) == 0
    assert live.ctx.inflight.count() == 0
    db = {**usage_rows(live.url, tenants[0][0]), **usage_rows(live.url, tenants[1][0])}
    rejected_path = ledger.spool.folder / REJECTED
    rejected: dict[str, list[dict]] = {}
    if rejected_path.exists():
        for line in rejected_path.read_text().splitlines():
            row = json.loads(line)
            rejected.setdefault(row["request_id"], []).append(row)
    for rid in done_ids:
        final = [db[rid]] if rid in db and db[rid]["status"] != "running" else []
        final += [r for r in rejected.get(rid, []) if r["status"] != "running"]
        assert final, f"request {rid}: no final record anywhere"
        assert all(r["status"] == "ok" for r in final)


def _steps(live) -> int:
    """Engine steps run so far (each step gives every running sequence one token)."""
    return int(live.ctx.engine.stats()["counters"]["steps"])


def _post_and_leave(url: str, key: str, body: dict, live) -> int:
    """A non-streaming request on a raw socket, closed once the engine is running it; returns the
    engine's step count at the moment the client left."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    wait_for(lambda: live.ctx.inflight.count(), interval=0.01, what="the request to start")
    started = _steps(live)
    wait_for(lambda: _steps(live) >= started + 3, interval=0.01, what="a few steps of the request")
    sock.close()
    return _steps(live)


def test_a_non_streaming_client_that_disconnects_stops_its_sequences(live):
    tid, key = new_tenant(live.url, "leaver")
    model = live.ctx.engine.model_name
    max_tokens, n = 1900, 4
    body = {"model": model, "prompt": "Once", "max_tokens": max_tokens, "n": n, "ignore_eos": True}
    before = _steps(live)  # nothing else runs on this server: every step from here is this request's
    left_at = _post_and_leave(live.url, key, body, live)
    deadline = time.monotonic() + 180
    while live.ctx.inflight.count() or live.ctx.quotas.running(tid):
        assert time.monotonic() < deadline, "the request kept running after its client left"
        time.sleep(0.05)
    live.ctx.ledger.flush()
    (row,) = usage_rows(live.url, tid).values()
    assert row["status"] == "aborted"
    # stopped early (the whole answer is 7,600 tokens), billed for what it had generated
    assert row["completion_tokens"] < n * max_tokens // 2
    # counted in tokens, not time: what was generated after the client left is a few engine steps'
    # worth (the abort lands at the next step once the event loop sees the disconnect), not the
    # rest of the answer; n tokens per step, a generous 150 steps for a crowded machine
    generated_while_connected = n * (left_at - before)
    assert row["completion_tokens"] - generated_while_connected <= n * 150, (row, left_at - before)
    window = live.ctx.quotas.usage_now(tid)["tokens_last_minute"]
    assert window == row["prompt_tokens"] + row["completion_tokens"]  # the quota settled to the bill


def test_a_nul_in_stored_or_searched_fields_is_a_400_never_a_500(live):
    """Found by the API fuzzer on PostgreSQL (text cannot hold NUL): a 500 before."""
    _tid, key = new_tenant(live.url, "nul")
    model = live.ctx.engine.model_name
    with httpx.Client(base_url=live.url, timeout=60) as c:
        for path, body in (
            ("/detokenize", {"model": "a\u0000b", "tokens": [1]}),
            ("/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 1, "user": "u\u0000"}),
            ("/v1/completions", {"model": "m\u0000", "prompt": "hi", "max_tokens": 1}),
        ):
            r = c.post(path, content=_raw(body), headers={**auth(key), "content-type": "application/json"})
            assert r.status_code == 400, (path, r.text)
            assert "a NUL character" in r.json()["error"]["message"], r.text  # says what, not "or"
        r = c.post("/admin/v1/tenants", content=_raw({"name": "n\u0000"}), headers=H)
        assert r.status_code == 400
        # a NUL in a prompt or a message is text like any other: tokenized, never stored
        for path, body in (
            ("/v1/completions", {"model": model, "prompt": "a\u0000b", "max_tokens": 1}),
            (
                "/v1/chat/completions",
                {"model": model, "messages": [{"role": "user", "content": "a\u0000b"}], "max_tokens": 1},
            ),
        ):
            r = c.post(path, content=_raw(body), headers={**auth(key), "content-type": "application/json"})
            assert r.status_code == 200, (path, r.text)
        r = c.get("/admin/v1/tenants/ten_%00x", headers=H)  # a NUL in a path parameter
        assert r.status_code in (400, 404), r.text


def test_a_lone_surrogate_user_under_another_tenants_load_hurts_no_one(live):
    """The original report: `"user": "\\ud800"` beside another tenant's load hung 6 of that tenant's
    385 requests and left its slots taken. Now the attacker gets 400s and the victim is untouched."""
    model = live.ctx.engine.model_name
    victim_tid, victim = new_tenant(live.url, "victim", quota={"max_concurrent": 6})
    attacker_tid, attacker = new_tenant(live.url, "attacker")

    async def victim_one(c: httpx.AsyncClient, i: int) -> tuple[int, str | None, int | None]:
        body = {"model": model, "prompt": f"Tale {i}", "max_tokens": 8, "n": 1 + i % 2, "stream": i % 3 == 0}
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        r = await c.post("/v1/completions", json=body, headers=auth(victim))
        if r.status_code != 200:
            return r.status_code, None, None
        if body["stream"]:
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            usage = next(e["usage"] for e in events if e.get("usage"))
            return 200, events[0]["id"].removeprefix("cmpl-"), usage["completion_tokens"]
        data = r.json()
        return 200, data["id"].removeprefix("cmpl-"), data["usage"]["completion_tokens"]

    async def attacker_one(c: httpx.AsyncClient, i: int) -> int:
        body = {"model": model, "prompt": "hi", "max_tokens": 4, "user": SURROGATE * (1 + i), "stream": i % 2 == 0}
        r = await c.post(
            "/v1/completions", content=_raw(body), headers={**auth(attacker), "content-type": "application/json"}
        )
        return r.status_code

    async def load():
        async with httpx.AsyncClient(base_url=live.url, timeout=180) as c:
            victims = asyncio.gather(*(victim_one(c, i) for i in range(24)))
            attacks = asyncio.gather(*(attacker_one(c, i) for i in range(12)))
            return await asyncio.wait_for(asyncio.gather(victims, attacks), timeout=300)  # a hang fails here

    victims, attacks = asyncio.run(load())
    assert attacks == [400] * 12
    assert {s for s, _, _ in victims} <= {200, 429} and sum(s == 200 for s, _, _ in victims) >= 6
    live.ctx.ledger.flush()
    assert live.ctx.quotas.running(victim_tid) == 0 and live.ctx.quotas.running(attacker_tid) == 0
    assert live.ctx.inflight.count() == 0
    rows = usage_rows(live.url, victim_tid)
    for status, rid, completion in victims:
        if status == 200:
            assert rows[rid]["status"] == "ok" and rows[rid]["completion_tokens"] == completion
    assert usage_rows(live.url, attacker_tid) == {}  # nothing of the attacker reached the ledger
