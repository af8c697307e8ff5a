"""The usage ledger on real SQLite and PostgreSQL: idempotent by request id, final records never
rewritten, one bad row never rejects the others, an unreachable database spools to an fsync'd file
that a later ledger replays, and a restart closes a dead run's records as interrupted."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future

import pytest
from harness.wait import wait_for
from sqlalchemy import select

from loraplex.platform.db.session import make_db_engine, make_session_factory
from loraplex.platform.usage.ledger import UsageLedger
from loraplex.platform.usage.models import UsageRecord
from loraplex.platform.usage.spool import Spool


def _row(rid: str, status: str = "ok", completion: int = 5, **extra) -> dict:
    return {
        **dict(
            request_id=rid,
            tenant_id="ten_a",
            api_key_id="key_a",
            adapter_id=None,
            adapter_name=None,
            endpoint="completions",
            prompt_tokens=3,
            completion_tokens=completion,
            ttft_ms=1.0,
            latency_ms=2.0,
            status=status,
        ),
        **extra,
    }


@pytest.fixture
def sessions(db_url):
    engine = make_db_engine(db_url)
    yield make_session_factory(engine)
    engine.dispose()


def _records(sessions) -> dict[str, UsageRecord]:
    with sessions() as s:
        return {r.request_id: r for r in s.scalars(select(UsageRecord))}


def test_upsert_is_idempotent_and_final_records_are_never_rewritten(sessions, tmp_path):
    ledger = UsageLedger(sessions, tmp_path / "spool").start()
    try:
        ledger.write(**_row("r1", "running", 0)).result(10)
        ledger.write(**_row("r1", "running", 7))  # a checkpoint
        ledger.write(**_row("r1", "ok", 9)).result(10)
        ledger.write(**_row("r1", "running", 3)).result(10)  # late / replayed: ignored
        ledger.write(**_row("r1", "aborted", 1)).result(10)  # a duplicate close: ignored
        for _ in range(3):
            ledger.write(**_row("r2", "ok", 4))
        ledger.flush()
    finally:
        ledger.close()
    rows = _records(sessions)
    assert set(rows) == {"r1", "r2"}
    assert (rows["r1"].status, rows["r1"].completion_tokens) == ("ok", 9)
    assert (rows["r2"].status, rows["r2"].completion_tokens) == ("ok", 4)


def test_one_bad_row_never_rejects_the_others(sessions, tmp_path):
    ledger = UsageLedger(sessions, tmp_path / "spool")  # not started: one batch, written inline
    futures = [ledger.write(**_row(f"good{i}")) for i in range(5)]
    futures.insert(2, ledger.write(**_row("bad", tenant_id=None)))  # NOT NULL violated
    ledger.flush()
    for f in futures:
        f.result(1)
    assert set(_records(sessions)) == {f"good{i}" for i in range(5)}
    assert ledger.stats.rejected == 1
    rejected = (tmp_path / "spool" / "usage.rejected.jsonl").read_text().splitlines()
    assert [json.loads(line)["request_id"] for line in rejected] == ["bad"]


def _unreachable_url(db_url: str, tmp_path) -> str:
    if db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'no-such-dir' / 'x' / 'db.sqlite'}"
    from sqlalchemy.engine import make_url

    return make_url(db_url).set(port=1).render_as_string(hide_password=False)  # nothing listens there


def test_outage_spools_durably_and_a_later_ledger_replays_once(sessions, db_url, tmp_path):
    spool = tmp_path / "spool"
    down_engine = make_db_engine(_unreachable_url(db_url, tmp_path))
    if db_url.startswith("sqlite"):
        # make_db_engine creates the parent folder; take it away so the file cannot be opened
        import shutil

        shutil.rmtree(tmp_path / "no-such-dir")
    down = UsageLedger(make_session_factory(down_engine), spool).start()
    try:
        down.write(**_row("a", "running", 0)).result(20)
        down.write(**_row("a", "ok", 6)).result(20)
        down.write(**_row("b", "running", 2)).result(20)  # this one never finishes (the server dies)
    finally:
        down._stopping = True  # simulate the crash: no clean shutdown flush to the database
    assert down.stats.spooled == 3 and down.stats.committed == 0
    files = Spool(spool).pending_files()  # replay attempts during the outage moved some aside
    lines = [line for f in files for line in f.read_text().splitlines()]
    assert [json.loads(x)["request_id"] for x in lines] == ["a", "a", "b"]
    for f in files:
        f.unlink()
    down_engine.dispose()

    for _ in range(2):  # replaying twice (a crash mid-replay) changes nothing
        (spool / "usage.spool.jsonl").write_text("\n".join(lines) + "\n")
        up = UsageLedger(sessions, spool)
        up.recover()
        up.close()
        rows = _records(sessions)
        assert set(rows) == {"a", "b"}
        assert (rows["a"].status, rows["a"].completion_tokens) == ("ok", 6)
        assert (rows["b"].status, rows["b"].completion_tokens) == ("interrupted", 2)
        assert not (spool / "usage.spool.jsonl").exists()


def test_recover_leaves_its_own_running_records_alone(sessions, tmp_path):
    ledger = UsageLedger(sessions, tmp_path / "spool")
    ledger.write(**_row("mine", "running", 1))
    ledger.flush()
    assert ledger.recover() == 0
    assert _records(sessions)["mine"].status == "running"
    # another server on the same database while this one's lease is fresh: hands off
    assert UsageLedger(sessions, tmp_path / "spool2").recover() == 0
    assert _records(sessions)["mine"].status == "running"
    # once this one's lease is older than the other server's tiny ttl, it is dead to that server
    recovered = wait_for(lambda: UsageLedger(sessions, tmp_path / "spool3", lease_ttl_s=0.01).recover(), timeout=60)
    assert recovered == 1
    assert _records(sessions)["mine"].status == "interrupted"


def test_store_sweep_removes_only_old_leftovers(platform, tmp_path):
    """Start-up/periodic housekeeping: staging leftovers and unreferenced store folders go, but only
    once older than the sweep's age (an upload in progress is never touched)."""
    import os

    from loraplex.platform.adapters.housekeeping import cleanup_store
    from loraplex.platform.db.session import unit_of_work

    store = platform.ctx.store
    old, fresh = store.staging_root / "old", store.staging_root / "fresh"
    orphan = store.root / "ab" / ("ab" * 32)
    for d in (old, fresh, orphan):
        d.mkdir(parents=True)
    past = time.time() - 7200
    os.utime(old, (past, past))
    os.utime(orphan, (past, past))
    with unit_of_work(platform.ctx.sessions) as s:
        removed = cleanup_store(s, store, min_age_s=3600)
    assert sorted(removed) == sorted([".staging/old", f"ab/{'ab' * 32}"])
    assert fresh.exists() and not old.exists() and not orphan.exists()


def test_a_label_the_driver_cannot_encode_is_billed_with_it_replaced(sessions, tmp_path):
    """The original bug: a lone surrogate (the OpenAI ``user`` field) raised UnicodeEncodeError in
    the driver during a group commit; not an SQLAlchemyError, so the whole batch was dropped and its
    waiters never answered. Then the bad row alone was set aside (refused: its tokens unbilled; a
    hostile run got such a ``user`` past the request guard). Now such text is stored with U+FFFD in
    place of the surrogate or NUL: every waiter answered, every record billed, none refused."""
    ledger = UsageLedger(sessions, tmp_path / "spool").start()
    futures: dict[str, Future] = {}
    lock = threading.Lock()

    def label(w: int, i: int) -> str:
        if w == 0 and i % 5 == 0:
            return "x\ud800"
        if w == 1 and i % 5 == 0:
            return "y\x00"
        return f"user{w}"

    def writer(w: int) -> None:
        for i in range(20):
            rid = f"w{w}-{i}"
            fut = ledger.write(**_row(rid, user=label(w, i), adapter_name="a\udfff" if w == 2 and i == 3 else None))
            with lock:
                futures[rid] = fut

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for fut in futures.values():
            fut.result(60)  # a hang fails here (TimeoutError)
    finally:
        ledger.close()
    records = _records(sessions)
    assert set(records) == set(futures)
    assert ledger.stats.rejected == 0 and not (tmp_path / "spool" / "usage.rejected.jsonl").exists()
    assert {records[f"w0-{i}"].user for i in range(0, 20, 5)} == {"x\ufffd"}
    assert {records[f"w1-{i}"].user for i in range(0, 20, 5)} == {"y\ufffd"}
    assert records["w2-3"].adapter_name == "a\ufffd" and records["w2-4"].user == "user2"
    assert all(r.completion_tokens == 5 for r in records.values())  # every one billed
