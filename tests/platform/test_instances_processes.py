"""Two real ``loraplex serve`` processes on one PostgreSQL database (the in-process variant is
test_instances.py):

- a rolling restart: server A streams, server B starts on the same database while they run (its
  start-up recovery and every later lease renewal must leave A's live rows alone), A's streams end,
  then A gets SIGTERM and drains the streams it still has. Every request is billed exactly the
  tokens its client received (counted from the stream's per-token logprobs, an oracle independent
  of the usage field), no row stays ``running``, nothing is ``interrupted``.
- ``kill -9`` of A while B lives: B notices A is dead (its lease renewal closes the rows of dead
  servers) and closes A's rows as ``interrupted``, billed up to the last checkpoint, never more
  than the client received.

The leases are short (LORAPLEX_LEDGER__LEASE_TTL_S) so nothing waits for the 30 s default; the
tests poll with generous deadlines and count lease renewals instead of sleeping."""

from __future__ import annotations

import json
import signal
import threading
from dataclasses import dataclass

import httpx
import pytest
from billing_helpers import H, auth, new_tenant, usage_rows
from harness.wait import wait_for
from sqlalchemy import create_engine, select

from loraplex.platform.usage.models import ServerInstance

# two server starts and thousands of streamed tokens: minutes on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(1800)]

ENV = {
    "LORAPLEX_LEDGER__CHECKPOINT_INTERVAL_S": "0.3",
    "LORAPLEX_ENGINE__MAX_NUM_SEQS": "8",
    "LORAPLEX_SECRET_KEY": "two-servers-one-database-shared-secret-0123",  # keys made on A work on B
}


@dataclass
class Received:
    """What one streaming client saw: tokens counted one by one from the logprobs."""

    request_id: str | None = None
    tokens: int = 0
    usage: int | None = None
    done: bool = False
    error: str | None = None


def _stream(url: str, key: str, model: str, max_tokens: int, seen: Received, prompt: str) -> None:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "logprobs": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with (
            httpx.Client(timeout=httpx.Timeout(300, connect=10)) as c,
            c.stream("POST", url + "/v1/completions", json=body, headers=auth(key)) as r,
        ):
            if r.status_code != 200:
                seen.error = f"{r.status_code}: {r.read()[:300]!r}"
                return
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    seen.done = True
                    return
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                seen.request_id = event["id"].removeprefix("cmpl-")
                if event.get("usage"):
                    seen.usage = event["usage"]["completion_tokens"]
                for ch in event.get("choices", []):
                    seen.tokens += len((ch.get("logprobs") or {}).get("tokens") or [])
    except (httpx.HTTPError, json.JSONDecodeError) as exc:  # the server died under it (kill -9)
        seen.error = repr(exc)


def _start_streams(url: str, key: str, model: str, count: int, max_tokens: int, tag: str):
    seen = [Received() for _ in range(count)]
    threads = [
        threading.Thread(target=_stream, args=(url, key, model, max_tokens, s, f"{tag} story {i}"), daemon=True)
        for i, s in enumerate(seen)
    ]
    for t in threads:
        t.start()
    return seen, threads


def _renewals(db_url: str, rounds: int, instances: int) -> None:
    """Wait until every lease row has been renewed ``rounds`` times (each renewal of a server is
    followed by its close_dead_runs pass over the others' records)."""
    eng = create_engine(db_url)
    seen: dict[str, set] = {}
    try:

        def enough() -> bool:
            with eng.connect() as conn:
                for iid, beat in conn.execute(select(ServerInstance.instance_id, ServerInstance.heartbeat_at)):
                    seen.setdefault(iid, set()).add(beat)
            return len(seen) >= instances and all(len(b) > rounds for b in seen.values())

        wait_for(enough, what=f"{rounds} lease renewals of {instances} servers", timeout=240, interval=0.1)
    finally:
        eng.dispose()


def _leases(db_url: str) -> int:
    eng = create_engine(db_url)
    try:
        with eng.connect() as conn:
            return len(conn.execute(select(ServerInstance.instance_id)).all())
    finally:
        eng.dispose()


def _servers(tmp_path, demo_model_dir, db_url, serve_process, lease_ttl_s: float):
    env = {**ENV, "LORAPLEX_DATABASE_URL": db_url, "LORAPLEX_LEDGER__LEASE_TTL_S": str(lease_ttl_s)}
    # a loaded 2-core machine can take minutes to start a second server beside the first
    return lambda name: serve_process(tmp_path / name / "data", demo_model_dir, env=env, start_timeout=600)


def test_rolling_restart_bills_every_stream_what_its_client_received(
    tmp_path, demo_model_dir, db_url_postgres, serve_process
):
    db = db_url_postgres
    # A lease this short lapses now and then beside two CPU burners (seen: B closed A's three live
    # rows as interrupted): billing must stay right anyway, A's own final writes win over that close.
    server = _servers(tmp_path, demo_model_dir, db, serve_process, lease_ttl_s=1.5)
    a = server("a")
    tid, key = new_tenant(a.url, "rolling")
    model = httpx.get(a.url + "/v1/models", headers=auth(key), timeout=120).json()["data"][0]["id"]

    b = server("b")  # the new server of the rolling restart, up beside A
    # A's streams run while B's recovery passes run (B's close_dead_runs follows each of its lease
    # renewals, the same pass as at its start): B started first because a quiet machine finishes
    # A's streams before B's start completes
    first, first_threads = _start_streams(a.url, key, model, 3, 1900, "first")
    wait_for(lambda: all(s.tokens >= 5 for s in first), what="A's streams to be under way", timeout=240, interval=0.1)
    _renewals(db, rounds=3, instances=2)
    assert not any(s.done or s.error for s in first), "A's streams ended before B's recovery ran: proves nothing"
    # B serves the same tenant meanwhile (one secret, one database)
    r = httpx.post(
        b.url + "/v1/completions",
        headers=auth(key),
        json={"model": model, "prompt": "hi", "max_tokens": 3},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    on_b = r.json()
    for t in first_threads:
        t.join(600)

    # a rolling restart: new streams on A, SIGTERM while they run; A drains them, then stops
    last, last_threads = _start_streams(a.url, key, model, 2, 200, "last")
    wait_for(
        lambda: all(s.tokens >= 3 for s in last), what="A's last streams to be under way", timeout=240, interval=0.1
    )
    a.proc.send_signal(signal.SIGTERM)
    for t in last_threads:
        t.join(600)
    # uvicorn re-raises the SIGTERM it handled once shutdown is complete: -15 is a clean stop
    assert a.proc.wait(300) in (0, -signal.SIGTERM), a.output()[-3000:]
    assert "Application shutdown complete" in a.output()

    rows = usage_rows(b.url, tid)
    for s in first + last:
        assert s.done and not s.error, s
        assert s.tokens == s.usage, s  # the client counted every token it was told about
        row = rows[s.request_id]
        assert row["status"] == "ok", row
        assert row["completion_tokens"] == s.tokens, (row, s)  # billed = delivered
    assert rows[on_b["id"].removeprefix("cmpl-")]["completion_tokens"] == on_b["usage"]["completion_tokens"]
    statuses = {r["status"] for r in rows.values()}
    assert statuses == {"ok"}, statuses  # nothing running, nothing interrupted
    assert len(rows) == len(first) + len(last) + 1
    assert _leases(db) == 1  # A gave its lease back on the clean stop
    assert "Traceback" not in a.output()


def test_kill9_with_a_neighbour_alive_bills_cut_streams_up_to_what_was_received(
    tmp_path, demo_model_dir, db_url_postgres, serve_process
):
    db = db_url_postgres
    # long enough not to lapse on a loaded machine (B must not close A's rows while A lives); B
    # still notices the kill at its next renewal (A's process is gone on this host)
    server = _servers(tmp_path, demo_model_dir, db, serve_process, lease_ttl_s=10)
    a = server("a")
    b = server("b")
    tid, key = new_tenant(a.url, "crash")
    model = httpx.get(a.url + "/v1/models", headers=auth(key), timeout=120).json()["data"][0]["id"]
    # the longest streams the demo model's 2,048-token context allows: a fast machine still needs
    # tens of seconds for them, so the kill cuts them while they run
    cut, threads = _start_streams(a.url, key, model, 3, 2000, "cut")
    seen_running: dict[str, int] = {}  # request id -> completion tokens of a running record seen

    def state() -> str:  # what a failure message shows: the clients, the records, A's log
        return f"clients={cut}\nrecords={usage_rows(b.url, tid)}\nA's log tail:\n{a.output()[-3000:]}"

    def checkpointed() -> bool:
        """Every stream has been seen with a running record that has tokens on it (at some poll:
        one stream may start a while after another on a loaded machine)."""
        rows = usage_rows(b.url, tid)
        for s in cut:
            row = rows.get(s.request_id or "")
            if row and row["status"] == "running" and row["completion_tokens"] > 0:
                seen_running[s.request_id] = row["completion_tokens"]
        if any(s.done for s in cut if s.request_id not in seen_running):
            raise AssertionError(f"a stream ended before a checkpoint of it was seen\n{state()}")
        return len(seen_running) == len(cut)

    wait_for(
        lambda: all(s.request_id for s in cut), what="A's streams to start", timeout=240, interval=0.1, details=state
    )
    wait_for(checkpointed, what="a checkpoint of every stream", timeout=240, interval=0.1, details=state)
    _renewals(db, rounds=2, instances=2)  # B renewed (and looked for dead servers) while A lived
    ended = {s.request_id for s in cut if s.done}  # read before the records: a stream may end meanwhile
    rows = usage_rows(b.url, tid)
    for s in cut:  # B closed none of a live server's rows (an ended stream was closed by A itself)
        assert rows[s.request_id]["status"] in (("ok",) if s.request_id in ended else ("running", "ok")), state()
    a.kill()
    for t in threads:
        t.join(120)
    killed = [s for s in cut if not s.done]
    assert killed, f"every stream ended before the kill: it proves nothing\n{state()}"
    assert all(s.error for s in killed), state()

    def closed() -> bool:
        rows = usage_rows(b.url, tid)
        return all(rows[s.request_id]["status"] != "running" for s in cut)

    wait_for(
        closed, what="B to close the dead server's rows", timeout=240, interval=0.1, details=state
    )  # B's lease renewal, no restart of anyone
    rows = usage_rows(b.url, tid)
    for s in cut:
        row = rows[s.request_id]
        if s.done:  # ended before the kill: billed exactly what its client received
            assert row["status"] == "ok" and row["completion_tokens"] == s.tokens, (row, s)
            continue
        assert row["status"] == "interrupted", row
        assert 0 < row["completion_tokens"] <= s.tokens, (row, s)  # up to the last checkpoint, never more
    assert f"closed {len(killed)} usage records of a server that stopped" in b.output(), b.output()[-3000:]
    assert httpx.get(b.url + "/admin/v1/usage", headers=H, timeout=120).status_code == 200
