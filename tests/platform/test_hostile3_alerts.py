"""Hostile webhook receivers (hostile3 review): a receiver answering 302 to a loopback address is
not followed, and a receiver that trickles its answer must not hold every other delivery."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest
from alerts_helpers import SECRET, Receiver, alert_settings
from harness.live import LiveServer
from harness.net import free_port
from harness.wait import wait_for
from platform_helpers import admin_headers, make_settings

from loraplex.platform.app import build_context, create_app
from loraplex.platform.engine_client import LocalEngineClient
from loraplex.platform.quotas.store import QuotaView

pytestmark = pytest.mark.slow


class Trickler:
    """Accepts, reads the request, then answers one header byte every ``every_s`` seconds, forever."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.port = free_port()
        self.sock = socket.create_server(("127.0.0.1", self.port))
        self.connected = threading.Event()
        self.stop = threading.Event()
        self.every_s = every_s
        threading.Thread(target=self._serve, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def _serve(self) -> None:
        self.sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        conn.recv(65536)
        self.connected.set()
        with conn:
            while not self.stop.wait(self.every_s):
                try:
                    conn.sendall(b"H")
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def server(tmp_path, db_url):
    settings = make_settings(tmp_path / "s", db_url, alerts=alert_settings(delivery_timeout_s=2.0, lease_s=4.0))
    ctx, _ = build_context(settings, LocalEngineClient.disabled(), upgrade_db=False)
    srv = LiveServer(create_app(ctx, owns_engine=False), ctx)
    yield srv
    srv.stop()


def _tenant(c: httpx.Client, name: str) -> str:
    return c.post("/admin/v1/tenants", json={"name": name}).json()["id"]


def test_redirect_to_loopback_is_not_followed(server):
    target = Receiver()
    port = free_port()

    import http.server

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(302)
            self.send_header("location", target.url)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    redir = http.server.ThreadingHTTPServer(("127.0.0.1", port), Redirect)
    threading.Thread(target=redir.serve_forever, daemon=True).start()
    try:
        with httpx.Client(base_url=server.url, headers=admin_headers(), timeout=30) as c:
            tid = _tenant(c, "a")
            c.post("/admin/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/", "secret": SECRET}).raise_for_status()
            server.ctx.quotas.reserve(tid, QuotaView(token_budget=100), 60)

            def tried():
                ev = c.get("/admin/v1/alerts/events").json()["data"]
                d = ev and ev[0]["deliveries"] and ev[0]["deliveries"][0]
                # attempts counts from the claim; the outcome is written once the answer is in
                return d if d and (d["last_status"] is not None or d["last_error"]) else None

            d = wait_for(tried, timeout=60, what="a delivery attempt")
        assert d["last_status"] == 302 and d["state"] == "pending", repr(d)[-600:]
        assert target.all() == []  # the redirect target never heard of it
    finally:
        redir.shutdown()
        target.stop()


def test_a_trickling_receiver_does_not_hold_other_deliveries(server):
    """hostile3: delivery_timeout_s was httpx's per-read timeout, so a receiver answering a byte every
    0.5 s held the one dispatcher thread forever and no other webhook was delivered. Now each
    delivery has one deadline for the whole exchange and a pass's deliveries run concurrently."""
    slow, good = Trickler(every_s=0.5), Receiver()
    try:
        with httpx.Client(base_url=server.url, headers=admin_headers(), timeout=30) as c:
            ta, tb = _tenant(c, "a"), _tenant(c, "b")
            c.post("/admin/v1/webhooks", json={"url": slow.url, "secret": SECRET, "tenant_id": ta}).raise_for_status()
            c.post("/admin/v1/webhooks", json={"url": good.url, "secret": SECRET, "tenant_id": tb}).raise_for_status()
        server.ctx.quotas.reserve(ta, QuotaView(token_budget=100), 60)
        assert slow.connected.wait(60)
        server.ctx.quotas.reserve(tb, QuotaView(token_budget=100), 60)
        # ten delivery timeouts (2 s each) and more: a deadline would have freed the dispatcher long before
        wait_for(lambda: good.accepted_ids(), timeout=30, what="tenant b's event delivered")
    finally:
        slow.close()
        good.stop()


def test_refusal_storm_from_many_scopes_is_one_event_per_scope_and_window(server):
    """1,500 admissions from 300 tenants at rpm=1: 1,200 refusals become at most one event per
    tenant, rule and clock minute, however many requests are refused."""
    from sqlalchemy import func, select

    from loraplex.platform.alerts.models import AlertEventRow
    from loraplex.platform.db.session import unit_of_work
    from loraplex.platform.errors import RateLimited

    with httpx.Client(base_url=server.url, headers=admin_headers(), timeout=30) as c:
        tids = [_tenant(c, f"t{i}") for i in range(300)]
    refused = 0
    for _ in range(5):
        for tid in tids:
            try:
                server.ctx.quotas.reserve(tid, QuotaView(rpm=1), 1)
            except RateLimited:
                refused += 1
    with unit_of_work(server.ctx.sessions) as s:
        rows = s.execute(select(AlertEventRow.tenant_id, func.count()).group_by(AlertEventRow.tenant_id)).all()
    assert refused == 1200
    # a run crossing a minute boundary may see two windows per tenant
    assert len(rows) == 300 and all(n <= 2 for _, n in rows), rows[:5]
