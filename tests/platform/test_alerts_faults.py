"""Alerts across faults: a ``loraplex serve`` killed (-9) in the middle of a delivery, and a
PostgreSQL server stopped while deliveries are in flight and events are being raised. Each event
reaches the real receiver (none lost) and the outbox holds each once (none duplicated by id; a
delivery the sender could not record is redelivered under the same webhook-id, as at-least-once
delivery must be, and the receiver dedupes by it)."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from alerts_helpers import SECRET, alert_settings
from harness.live import LiveServer
from harness.wait import wait_for
from platform_helpers import admin_headers, make_settings
from sqlalchemy import select

from loraplex.platform.alerts.events import AlertEvent, AlertKind
from loraplex.platform.alerts.models import AlertDelivery, AlertEventRow
from loraplex.platform.alerts.outbox import Outbox
from loraplex.platform.app import build_context, create_app
from loraplex.platform.db import migrate
from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import make_db_engine, make_session_factory
from loraplex.platform.engine_client import LocalEngineClient

pytestmark = pytest.mark.slow


def _event(i: int) -> AlertEvent:
    now = utcnow().replace(microsecond=0)
    return AlertEvent(
        AlertKind.THRESHOLD, "tenant", f"ten_{i:03d}", None, "token_budget", "tokens", 100, 80, now, now, 80
    )


def _outbox_state(db_url: str) -> tuple[list[str], list[tuple[str, str]]]:
    engine = make_db_engine(db_url)
    try:
        with make_session_factory(engine)() as s:
            ids = list(s.scalars(select(AlertEventRow.id)))
            deliveries = [(d.event_id, d.state) for d in s.scalars(select(AlertDelivery))]
        return ids, deliveries
    finally:
        engine.dispose()


def test_kill_9_mid_delivery_then_restart_delivers_every_event(tmp_path, serve_process, receiver):
    alerts = alert_settings(lease_s=6.0)
    env = {f"LORAPLEX_ALERTS__{k.upper()}": json.dumps(v) if isinstance(v, list) else str(v) for k, v in alerts.items()}
    env["LORAPLEX_ENGINE__ENABLED"] = "false"
    server = serve_process(tmp_path / "data", None, env=env, config=None)
    db_url = f"sqlite:///{(tmp_path / 'data' / 'loraplex.db').resolve()}"
    with httpx.Client(base_url=server.url, headers=admin_headers(), timeout=30) as c:
        assert c.post("/admin/v1/webhooks", json={"url": receiver.url, "secret": SECRET}).status_code == 201
    receiver.hold.set()  # the first delivery hangs: the server is killed with it in flight
    engine = make_db_engine(db_url)
    Outbox(make_session_factory(engine)).emit([_event(i) for i in range(5)])
    engine.dispose()
    assert receiver.arrived.wait(120), "the server never started delivering"
    server.kill()
    ids, deliveries = _outbox_state(db_url)
    assert len(ids) == 5 and {state for _, state in deliveries} == {"pending"}  # nothing recorded as sent
    receiver.hold.clear()
    receiver.release.set()  # the held request ends unanswered (its sender is dead)
    server.start()  # same data dir and port: the leases of the dead process expire, then redelivered
    wait_for(lambda: set(receiver.accepted_ids()) == set(ids), timeout=180, what="every event delivered")
    wait_for(lambda: {s for _, s in _outbox_state(db_url)[1]} == {"delivered"}, timeout=60)
    assert all(r["verified"] for r in receiver.all())
    assert max(Counter(receiver.accepted_ids()).values()) == 1
    assert sorted(_outbox_state(db_url)[0]) == sorted(ids)  # no event added or lost by the restart


def test_postgres_outage_loses_and_duplicates_nothing(tmp_path, private_postgres, receiver):
    pg = private_postgres
    migrate.upgrade(pg.url)
    settings = make_settings(tmp_path, pg.url, alerts=alert_settings(lease_s=6.0))
    ctx, _ = build_context(settings, LocalEngineClient.disabled(), upgrade_db=False)
    srv = LiveServer(create_app(ctx, owns_engine=False), ctx)
    try:
        with httpx.Client(base_url=srv.url, headers=admin_headers(), timeout=30) as c:
            assert c.post("/admin/v1/webhooks", json={"url": receiver.url, "secret": SECRET}).status_code == 201
        receiver.hold.set()
        receiver.accept_held = True  # the receiver gets it; the sender cannot record that (database down)
        ctx.outbox.emit([_event(i) for i in range(5)])
        assert receiver.arrived.wait(120)
        pg.stop()
        ctx.outbox.emit([_event(i) for i in range(5, 8)])  # raised during the outage: kept, written later
        receiver.hold.clear()
        receiver.release.set()
        # the held delivery is answered 200 during the outage: its outcome cannot be recorded, so the
        # pass stops there (the rest of its claimed batch waits for the leases) and it is sent again
        wait_for(lambda: receiver.accepted_ids(), timeout=60, what="the held delivery accepted")
        pg.start()
        wait_for(lambda: len(set(receiver.accepted_ids())) == 8, timeout=180, what="all 8 events accepted")
        wait_for(
            lambda: (lambda st: len(st[1]) == 8 and {s for _, s in st[1]} == {"delivered"})(_outbox_state(pg.url)),
            timeout=60,
            what="every delivery recorded",
        )
        ids, _ = _outbox_state(pg.url)
        assert len(ids) == 8 and set(receiver.accepted_ids()) == set(ids)  # none lost, none duplicated in the outbox
        assert all(r["verified"] for r in receiver.all())
        assert Counter(receiver.accepted_ids())[receiver.all()[0]["id"]] == 2  # redelivered, same webhook-id
        tenants = Counter(r["body"]["data"]["tenant_id"] for r in receiver.all() if r["status"] == 200)
        assert set(tenants) == {f"ten_{i:03d}" for i in range(8)}
    finally:
        srv.stop()
