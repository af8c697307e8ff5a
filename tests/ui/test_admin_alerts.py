"""The admin page's Alerts view in real Chromium: the registered webhooks (never a secret) and the
newest events with each delivery's state, checked against the admin API after a real receiver
accepted one event and refused another until it was dead. Hostile text in a URL is shown as text."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # conftest's _need_browser skips every test here (or fails it in CI)
    expect = None

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))  # alerts_helpers
from alerts_helpers import SECRET, Receiver  # noqa: E402
from harness.wait import wait_for  # noqa: E402
from ui_helpers import screenshot, unique  # noqa: E402

from loraplex.platform.alerts.events import AlertEvent, AlertKind  # noqa: E402
from loraplex.platform.db.base import utcnow  # noqa: E402

pytestmark = pytest.mark.slow  # a browser


def test_alerts_view_shows_webhooks_and_deliveries(signed_in, server, tmp_path):
    page = signed_in
    alerts = server.ctx.settings.alerts
    saved = (list(alerts.allowed_hosts), alerts.max_attempts, alerts.backoff_base_s, alerts.backoff_max_s)
    alerts.allowed_hosts, alerts.max_attempts, alerts.backoff_base_s, alerts.backoff_max_s = ["127.0.0.1"], 2, 0.1, 0.2
    good, bad = Receiver(), Receiver()
    try:
        with server.admin() as c:
            tid = c.post("/admin/v1/tenants", json={"name": unique("alerted")}).json()["id"]
            ok = c.post("/admin/v1/webhooks", json={"url": good.url, "secret": SECRET, "tenant_id": tid}).json()
            hostile = f"{bad.url}?<img src=x onerror=alert(1)>"
            dead = c.post("/admin/v1/webhooks", json={"url": hostile, "secret": SECRET, "tenant_id": tid}).json()
        bad.script = [500] * 10
        now = utcnow().replace(microsecond=0)
        event = AlertEvent(AlertKind.THRESHOLD, "tenant", tid, None, "token_budget", "tokens", 1000, 812, now, now, 80)
        server.ctx.outbox.emit([event])

        def settled() -> list | None:
            with server.admin() as c:
                data = c.get("/admin/v1/alerts/events", params={"tenant_id": tid}).json()["data"]
            states = sorted(d["state"] for d in data[0]["deliveries"]) if data else []
            return data if states == ["dead", "delivered"] else None

        api_events = wait_for(settled, timeout=60, what="one delivered, one dead")

        page.get_by_role("link", name="Alerts").click()
        expect(page.get_by_role("heading", name="Alerts", exact=True)).to_be_visible()
        hooks = page.get_by_role("table", name="Webhooks")
        expect(hooks.get_by_role("row").filter(has_text=ok["id"])).to_have_count(1)
        expect(hooks.get_by_role("row").filter(has_text=dead["id"])).to_contain_text(hostile)  # as text
        expect(hooks).not_to_contain_text(SECRET)

        page.get_by_label("Tenant ID").fill(tid)
        page.get_by_role("button", name="Show events").click()
        table = page.get_by_role("table", name="Recent alert events (1)")
        row = table.get_by_role("row").filter(has_text=api_events[0]["id"])
        expect(row).to_contain_text("token_budget 80 % · 812 / 1000 tokens")
        expect(row.locator("li[data-state=delivered]")).to_contain_text(ok["id"])
        expect(row.locator("li[data-state=dead]")).to_contain_text("2 attempt(s) · HTTP 500")
        assert page.locator("img").count() == 0  # the URL's markup was never parsed
        screenshot(page, "admin-alerts", tmp_path)
    finally:
        alerts.allowed_hosts, alerts.max_attempts, alerts.backoff_base_s, alerts.backoff_max_s = saved
        good.stop()
        bad.stop()
