"""Alerts' closed gaps (issue 37), on SQLite and PostgreSQL with a real receiving server: caps on
webhooks and on one event's fan-out (422), DNS rebinding (the delivery connects to the address the
SSRF check passed: the name is resolved once, through a resolver the test answers as an attacker's
DNS server would), and the retention sweep of finished deliveries and closed-window events."""

from __future__ import annotations

import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from alerts_helpers import SECRET, admin
from harness.wait import wait_for
from sqlalchemy import func, select

from loraplex.platform.alerts.events import AlertEvent, AlertKind
from loraplex.platform.alerts.models import DEAD, DELIVERED, AlertDelivery, AlertEventRow
from loraplex.platform.db.base import utcnow


def _event(tenant_id: str, start=None, end=None) -> AlertEvent:
    now = utcnow().replace(microsecond=0)
    return AlertEvent(
        AlertKind.THRESHOLD, "tenant", tenant_id, None, "token_budget", "tokens", 100, 80, start or now, end or now, 80
    )


def hook(c: httpx.Client, url: str, tenant_id: str | None = None) -> httpx.Response:
    return c.post("/admin/v1/webhooks", json={"url": url, "secret": SECRET, "tenant_id": tenant_id})


def test_webhook_caps_are_422(alert_servers, receiver):
    srv = alert_servers(max_webhooks_per_tenant=2, max_operator_webhooks=2, max_fanout_per_event=3)
    with admin(srv) as c:
        acme = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
        other = c.post("/admin/v1/tenants", json={"name": "other"}).json()["id"]
        assert hook(c, receiver.url, acme).status_code == 201
        assert hook(c, receiver.url, acme).status_code == 201
        third = hook(c, receiver.url, acme)  # a tenant's own cap
        assert third.status_code == 422 and third.json()["error"]["code"] == "too_many_webhooks", third.text
        assert hook(c, receiver.url).status_code == 201  # operator-wide: acme's events now go to 3
        fanout = hook(c, receiver.url)  # a 4th receiver of acme's events: past the fan-out cap
        assert fanout.status_code == 422 and "max_fanout_per_event" in fanout.json()["error"]["message"]
        assert hook(c, receiver.url, other).status_code == 201  # other: 1 operator + 1 own
        assert hook(c, receiver.url, other).status_code == 201  # 1 + 2 = 3: at the cap, allowed
        # concurrent registrations cannot pass the cap together (counted under one lock)
        tenant = c.post("/admin/v1/tenants", json={"name": "race"}).json()["id"]
        got: list[int] = []
        threads = [
            threading.Thread(target=lambda: got.append(hook(c, receiver.url, tenant).status_code)) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got) == [201, 201, 422, 422, 422, 422], got
        listed = c.get("/admin/v1/webhooks").json()["data"]
        assert sum(1 for h in listed if h["tenant_id"] == tenant) == 2


def test_fan_out_stops_at_the_cap_when_it_was_lowered(alert_servers, receiver):
    srv = alert_servers(max_fanout_per_event=5)
    with admin(srv) as c:
        acme = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
        for _ in range(5):
            assert hook(c, receiver.url, acme).status_code == 201
    srv.ctx.settings.alerts.max_fanout_per_event = 2  # lowered after registration (a restart with new settings)
    srv.ctx.outbox.emit([_event(acme)])
    wait_for(lambda: len(receiver.accepted_ids()) >= 2, timeout=60, what="two deliveries")
    with srv.ctx.sessions() as s:
        wait_for(lambda: s.scalar(select(func.count()).select_from(AlertDelivery)) == 2, timeout=30)
    assert len(receiver.accepted_ids()) == 2


class Resolver:
    """A DNS server the attacker controls: each lookup of ``name`` answers the next address of
    ``answers`` (the last one again once they run out); counts the lookups."""

    def __init__(self, name: str, answers: list[str]) -> None:
        self.name, self.answers, self.calls = name, list(answers), 0
        self.lock = threading.Lock()

    def __call__(self, host: str) -> list[str]:
        if host != self.name:
            raise OSError(f"no such host {host}")
        with self.lock:
            self.calls += 1
            return [self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]]


def _internal_service(port: int) -> tuple[ThreadingHTTPServer, list[str]]:
    """What the attacker wants reached: a service on another loopback address, same port."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            hits.append(self.headers.get("host", ""))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, hits


def test_delivery_connects_to_the_checked_address(alert_servers, receiver):
    """The name answers the receiver's address to the check and the internal service's to any later
    lookup: the delivery reaches the receiver (pinned), with the name as Host, one lookup per attempt."""
    srv = alert_servers(allowed_hosts=["hooks.rebind.test"])
    name = "hooks.rebind.test"
    dns = Resolver(name, ["127.0.0.1", "127.0.0.2"])
    srv.ctx.webhook_resolver = dns
    internal, hits = _internal_service(receiver.port)
    try:
        with admin(srv) as c:
            acme = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
            assert hook(c, f"http://{name}:{receiver.port}/hook", acme).status_code == 201
        srv.ctx.outbox.emit([_event(acme)])
        wait_for(lambda: receiver.accepted_ids(), timeout=60, what="the delivery")
        assert hits == [] and dns.calls == 1
        assert all(r["verified"] for r in receiver.all())
    finally:
        internal.shutdown()
        internal.server_close()


def test_a_name_rebound_to_loopback_is_refused_at_delivery(alert_servers, receiver):
    """Public at registration, loopback at delivery (DNS rebinding): refused, nothing sent, the
    reason on the delivery; an answer mixing a public and a private address is refused too."""
    srv = alert_servers(max_attempts=2)
    name = "evil.rebind.test"
    dns = Resolver(name, ["93.184.216.34", "127.0.0.1"])
    srv.ctx.webhook_resolver = dns
    with admin(srv) as c:
        acme = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
        assert hook(c, f"http://{name}:{receiver.port}/hook", acme).status_code == 201
        srv.ctx.outbox.emit([_event(acme)])

        def dead() -> dict | None:
            events = c.get("/admin/v1/alerts/events").json()["data"]
            d = events[0]["deliveries"] if events else []
            return d[0] if d and d[0]["state"] == "dead" else None

        d = wait_for(dead, timeout=60, what="the delivery refused until dead")
        assert "non-public" in d["last_error"] and "127.0.0.1" in d["last_error"], d
        assert receiver.all() == []
        srv.ctx.webhook_resolver = lambda host: ["93.184.216.34", "10.0.0.7"]
        mixed = hook(c, "http://mixed.rebind.test/hook")
        assert mixed.status_code == 400 and "10.0.0.7" in mixed.json()["error"]["message"]
        srv.ctx.webhook_resolver = lambda host: ["not-an-address"]
        assert hook(c, "http://junk.rebind.test/hook").status_code == 400


def test_retention_sweeps_finished_rows_and_closed_windows(alert_servers, receiver):
    srv = alert_servers(retention_days=1, max_attempts=1)
    with admin(srv) as c:
        acme = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
        assert hook(c, receiver.url, acme).status_code == 201
    now = utcnow()
    closed = _event(acme, now - timedelta(days=40), now - timedelta(days=10))
    open_window = AlertEvent(
        AlertKind.REFUSED,
        "tenant",
        acme,
        None,
        "token_budget",
        "tokens",
        1,
        2,
        now - timedelta(days=5),
        now + timedelta(days=5),
    )
    receiver.script = [200, 500]  # one delivered, one dead
    srv.ctx.outbox.emit([closed, open_window])
    with srv.ctx.sessions() as s:
        wait_for(
            lambda: (
                s.scalar(
                    select(func.count()).select_from(AlertDelivery).where(AlertDelivery.state.in_((DELIVERED, DEAD)))
                )
                == 2
            ),
            timeout=60,
            what="both deliveries finished",
        )
        s.rollback()
    pending_event = _event(acme, now - timedelta(days=30), now - timedelta(days=29))
    srv.ctx.alert_dispatcher.stop()  # the sweep is driven by hand from here
    srv.ctx.outbox.emit([pending_event])  # not fanned out: never swept
    assert srv.ctx.alert_dispatcher.sweep_once(now) == (0, 0)  # nothing older than a day yet
    assert srv.ctx.alert_dispatcher.sweep_once(now + timedelta(days=2)) == (2, 1)  # the open window stays
    with srv.ctx.sessions() as s:
        left = {r.dedupe_key.split(":")[0] + ":" + r.dedupe_key.split(":")[1] for r in s.scalars(select(AlertEventRow))}
        assert s.scalar(select(func.count()).select_from(AlertEventRow)) == 2, left
        assert s.scalar(select(func.count()).select_from(AlertDelivery)) == 0
    # the open window's event keeps its dedupe key: the same window does not fire again
    srv.ctx.outbox.emit([open_window])
    with srv.ctx.sessions() as s:
        assert (
            s.scalar(select(func.count()).select_from(AlertEventRow).where(AlertEventRow.kind == "limit.refused")) == 1
        )


def test_pinned_target_keeps_the_name_for_host_and_sni():
    from loraplex.platform.alerts.urls import UnsafeUrl, pinned_target
    from loraplex.platform.settings import AlertSettings

    s = AlertSettings()
    t = pinned_target("https://hooks.example.com:8443/a/b?c=d#frag", s, lambda host: ["93.184.216.34"])
    assert (t.url, t.host_header, t.sni_hostname) == (
        "https://93.184.216.34:8443/a/b?c=d",
        "hooks.example.com:8443",
        "hooks.example.com",
    )
    t = pinned_target(
        "http://hooks.example.com/x", s, lambda host: ["2606:2800:220:1:248:1893:25c8:1946", "93.184.216.34"]
    )
    assert (t.url, t.host_header, t.sni_hostname) == (
        "http://[2606:2800:220:1:248:1893:25c8:1946]/x",
        "hooks.example.com",
        None,
    )
    for answers in (["127.0.0.1"], ["93.184.216.34", "169.254.169.254"], ["64:ff9b::a9fe:a9fe"], [], ["::1"]):
        with pytest.raises(UnsafeUrl):
            pinned_target("http://hooks.example.com/x", s, lambda host, a=answers: a)
    allowed = AlertSettings(allowed_hosts=["hooks.internal"])  # allowed: not checked, still pinned
    t = pinned_target("http://hooks.internal:9/x", allowed, lambda host: ["10.0.0.5"])
    assert t.url == "http://10.0.0.5:9/x" and t.host_header == "hooks.internal:9"


def test_an_unsignable_secret_is_refused_and_an_old_one_goes_dead(alert_servers, receiver):
    """whsec_ secrets that are not base64 of 16+ bytes are a 422; one stored before that check
    (written here straight into the table) fails its attempts and goes dead, and the other
    webhook's delivery of the same event is not held up by it."""
    from loraplex.platform.alerts.models import AlertWebhook

    srv = alert_servers(max_attempts=2)
    with admin(srv) as c:
        for bad in ("whsec_" + "a" * 17, "whsec_" + "!" * 16, "whsec_" + "QUFB" * 3):  # 17 chars / empty key / 9 bytes
            r = c.post("/admin/v1/webhooks", json={"url": receiver.url, "secret": bad})
            assert r.status_code == 422 and r.json()["error"]["param"] == "secret", r.text
        assert c.post("/admin/v1/webhooks", json={"url": receiver.url, "secret": SECRET}).status_code == 201
    with srv.ctx.sessions() as s:
        s.add(AlertWebhook(id="whk_old", url=receiver.url, secret="whsec_" + "a" * 17, events=[], tenant_id=None))
        s.commit()
    srv.ctx.outbox.emit([_event("ten_x")])
    with admin(srv) as c:

        def settled() -> list | None:
            events = c.get("/admin/v1/alerts/events").json()["data"]
            ds = {d["webhook_id"]: d for d in events[0]["deliveries"]} if events else {}
            return ds if ds.get("whk_old", {}).get("state") == "dead" and len(ds) == 2 else None

        ds = wait_for(settled, timeout=60, what="the unsignable delivery dead")
    assert ds["whk_old"]["attempts"] == 2 and "base64" in ds["whk_old"]["last_error"].lower(), ds
    assert [d["state"] for w, d in ds.items() if w != "whk_old"] == ["delivered"]
    assert len(receiver.accepted_ids()) == 1
