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


def test_a_second_server_leaves_a_live_servers_streams_alone(live_factory):
    a = live_factory()
    tid, key = new_tenant(a.url, "rolling")
    model = a.ctx.gateway.model_name
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
