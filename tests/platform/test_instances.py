"""Several servers on one database: each holds a lease (a heartbeat row), and start-up recovery
closes only the running records of servers whose lease expired. A second server starting next to
a busy one (a rolling or blue-green restart) leaves the first one's live streams alone: each is
billed exactly what its client received."""

from __future__ import annotations

import threading
import time

import pytest
from billing_helpers import new_tenant, stream, usage_rows
from sqlalchemy import select

from loraplex.platform.usage.models import ServerInstance, UsageRecord


def _running(ctx) -> int:
    with ctx.sessions() as s:
        rows = s.scalars(select(UsageRecord).where(UsageRecord.status == "running")).all()
        return sum(1 for r in rows if r.instance_id == ctx.ledger.instance_id)


# Three 1200-token streams kept alive across a second server's start-up (long on purpose, so the
# recovery really meets running records): ~1200 decode steps.
@pytest.mark.slow
def test_a_second_server_leaves_a_live_servers_streams_alone(live_factory):
    a = live_factory()
    tid, key = new_tenant(a.url, "rolling")
    model = a.ctx.engine.model_name
    results: list = []

    def one(i: int) -> None:
        results.append(stream(a.url, key, model, prompt=f"Story {i}", max_tokens=1200, ignore_eos=True, timeout=300))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while _running(a.ctx) < 3:
        assert time.monotonic() < deadline, "the streams never started"
        time.sleep(0.02)
    b = live_factory()  # the new server: its start-up recovery runs now, on the same database
    assert _running(a.ctx) == 3 or not all(t.is_alive() for t in threads)
    with a.ctx.sessions() as s:
        leases = set(s.scalars(select(ServerInstance.instance_id)))
    assert {a.ctx.ledger.instance_id, b.ctx.ledger.instance_id} <= leases
    for t in threads:
        t.join(300)
    a.ctx.ledger.flush()
    rows = usage_rows(b.url, tid)
    assert len(results) == 3
    for res in results:
        assert res.status == 200 and res.done and res.usage, res
        row = rows[res.request_id]
        assert row["status"] == "ok"
        assert row["completion_tokens"] == res.usage["completion_tokens"] == 1200  # billed = delivered
    # a rolling restart: the old server stops cleanly and gives its lease back
    a.stop()
    with b.ctx.sessions() as s:
        leases = set(s.scalars(select(ServerInstance.instance_id)))
    assert a.ctx.ledger.instance_id not in leases and b.ctx.ledger.instance_id in leases


@pytest.mark.parametrize("expired", [True, False])
def test_recovery_closes_only_records_of_expired_leases(live_factory, expired):
    """A record left running by a server whose lease is stale is closed; by a fresh lease, kept."""
    from datetime import timedelta

    from loraplex.platform.db.base import utcnow

    a = live_factory()
    with a.ctx.sessions.begin() as s:
        s.add(ServerInstance(instance_id="elsewhere", hostname="another-host", pid=1, heartbeat_at=utcnow()))
        s.add(UsageRecord(request_id="r1", tenant_id="t", status="running", instance_id="elsewhere"))
        if expired:
            s.get(ServerInstance, "elsewhere").heartbeat_at = utcnow() - timedelta(seconds=120)
    closed = a.ctx.ledger.close_dead_runs()
    with a.ctx.sessions() as s:
        status = s.scalar(select(UsageRecord.status).where(UsageRecord.request_id == "r1"))
    assert (closed, status) == ((1, "interrupted") if expired else (0, "running"))


def test_a_clean_stop_lands_a_pending_spool(live_factory, tmp_path):
    """Found by the chaos soak: a server stopped (SIGTERM, rolling restart) soon after a database
    outage kept its final records in its local spool, so they stayed ``running`` in the database."""
    from loraplex.platform.usage.ledger import UsageLedger

    a = live_factory()
    ledger = UsageLedger(a.ctx.sessions, tmp_path / "spool")
    row = {"request_id": "spooled-1", "tenant_id": "t", "status": "ok", "completion_tokens": 7}
    ledger.spool.append([{**row, "instance_id": ledger.instance_id, "created_at": "2026-12-01T00:00:00+00:00"}])
    assert ledger.spool.has_pending()
    ledger.close()
    assert not ledger.spool.has_pending()
    with a.ctx.sessions() as s:
        rec = s.scalar(select(UsageRecord).where(UsageRecord.request_id == "spooled-1"))
    assert rec is not None and (rec.status, rec.completion_tokens) == ("ok", 7)


def _rec(sessions, rid: str) -> tuple[str, int]:
    with sessions() as s:
        r = s.scalar(select(UsageRecord).where(UsageRecord.request_id == rid))
        return r.status, r.completion_tokens


def _row(rid: str, status: str, completion: int) -> dict:
    return dict(
        request_id=rid,
        tenant_id="t",
        endpoint="completions",
        prompt_tokens=2,
        completion_tokens=completion,
        status=status,
    )


def _lapse(sessions, instance_id: str) -> None:
    """The owner's lease looks dead to its peers (a machine stopped longer than the ttl)."""
    from datetime import timedelta

    from loraplex.platform.db.base import utcnow

    with sessions.begin() as s:
        s.get(ServerInstance, instance_id).heartbeat_at = utcnow() - timedelta(seconds=600)


@pytest.fixture
def sessions(db_url):
    from loraplex.platform.db.session import make_db_engine, make_session_factory

    engine = make_db_engine(db_url)
    yield make_session_factory(engine)
    engine.dispose()


def test_the_owners_writes_win_over_a_peers_interrupted_close(sessions, tmp_path):
    """Found by the rolling-restart test under load: server A's lease lapsed while it streamed, the
    new server B closed A's live row as ``interrupted``, and A's final ``ok`` write was refused, so
    the client was billed as of A's last checkpoint. The owner's writes now win over that close (the
    same row, so nothing is counted twice); a peer's never do; final rows stay final."""
    from loraplex.platform.usage.ledger import UsageLedger

    a = UsageLedger(sessions, tmp_path / "a")
    b = UsageLedger(sessions, tmp_path / "b")
    a.lease.beat()
    b.lease.beat()
    for rid in ("r1", "r2"):
        a.write(**_row(rid, "running", 5))
    a.flush()
    _lapse(sessions, a.instance_id)
    assert b.close_dead_runs() == 2  # B takes A for dead
    assert _rec(sessions, "r1") == ("interrupted", 5)

    a.write(**_row("r1", "running", 8))  # A's next checkpoint: the row is A's again
    a.flush()
    assert _rec(sessions, "r1") == ("running", 8)
    assert b.close_dead_runs() == 1  # still lapsed: closed again
    a.write(**_row("r1", "ok", 12))  # A's final write: billed what its client received
    a.flush()
    assert _rec(sessions, "r1") == ("ok", 12)
    a.write(**_row("r1", "running", 3))  # late or replayed writes after the end change nothing
    a.write(**_row("r1", "aborted", 1))
    a.flush()
    assert b.close_dead_runs() == 0
    assert _rec(sessions, "r1") == ("ok", 12)

    b.write(**_row("r2", "ok", 99))  # a peer never writes over another server's row
    b.flush()
    assert _rec(sessions, "r2") == ("interrupted", 5)
    with sessions() as s:  # one row per request: nothing counted twice
        assert len(s.scalars(select(UsageRecord)).all()) == 2


def test_a_spooled_final_write_lands_over_an_interrupted_close_at_restart(sessions, tmp_path):
    """A server whose final writes were spooled (database outage longer than its lease) and that
    then restarts on its data dir: the replayed rows carry the old instance id, the owner's, so they
    win over the close a peer made meanwhile."""
    from loraplex.platform.usage.ledger import UsageLedger

    a = UsageLedger(sessions, tmp_path / "a")
    a.lease.beat()
    a.write(**_row("r1", "running", 4))
    a.flush()
    _lapse(sessions, a.instance_id)
    assert UsageLedger(sessions, tmp_path / "b").recover() == 1
    final = {**_row("r1", "ok", 9), "instance_id": a.instance_id, "created_at": "2026-12-01T00:00:00+00:00"}
    restarted = UsageLedger(sessions, tmp_path / "a")
    restarted.spool.append([final])
    restarted.recover()
    assert _rec(sessions, "r1") == ("ok", 9)


def test_the_heartbeat_has_a_connection_of_its_own(db_url, tmp_path):
    """Request handlers holding every pooled connection must not keep a server from renewing its
    lease (it would look dead to its peers)."""
    from sqlalchemy import create_engine

    from loraplex.platform.db.session import make_session_factory
    from loraplex.platform.usage.ledger import UsageLedger

    engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=1)
    sessions = make_session_factory(engine)
    ledger = UsageLedger(sessions, tmp_path / "spool")
    try:
        with engine.connect():  # the only pooled connection is taken
            for _ in range(3):
                ledger.lease.beat()
        with sessions() as s:
            assert s.get(ServerInstance, ledger.instance_id) is not None
    finally:
        ledger.lease.release()
        engine.dispose()
