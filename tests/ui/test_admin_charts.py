"""The admin page's charts in real Chromium: usage over time per tenant and adapter, the live batch
and share-of-service charts while two tenants generate, and a tenant's quota consumption. What the
charts show is checked against the admin API and the tenant API's own usage numbers."""

from __future__ import annotations

import threading
import uuid

import openai
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # conftest's _need_browser skips every test here (or fails it in CI)
    expect = None

from platform_helpers import zip_bytes
from ui_helpers import screenshot

pytestmark = pytest.mark.slow  # a browser


def _tenant(c, name: str, weight: float) -> tuple[str, str]:
    tid = c.post("/admin/v1/tenants", json={"name": name, "weight": weight}).json()["id"]
    key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
    c.put(f"/admin/v1/tenants/{tid}/quota", json={"rpm": 100, "token_budget": 100000, "budget_period": "day"})
    return tid, key


def test_usage_engine_and_quota_charts(signed_in, server, ui_adapter_files, tmp_path):
    page = signed_in
    tag = uuid.uuid4().hex[:6]
    names = (f"light-{tag}", f"heavy-{tag}")
    with server.admin() as c:
        (t1, k1), (t2, k2) = _tenant(c, names[0], 1.0), _tenant(c, names[1], 3.0)
        ada = f"chartbot-{tag}"
        assert (
            c.post(
                "/admin/v1/adapters",
                data={"name": ada, "tenant_id": t1},
                files={"file": ("a.zip", zip_bytes(ui_adapter_files))},
            ).status_code
            == 201
        )
    base = server.ctx.engine.model_name
    clients = {
        t: openai.OpenAI(base_url=server.url + "/v1", api_key=k, max_retries=0, timeout=120)
        for t, k in ((t1, k1), (t2, k2))
    }
    tokens = {t1: 0, t2: 0}
    for model in (ada, base):
        r = clients[t1].completions.create(model=model, prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True})
        tokens[t1] += r.usage.total_tokens
    r = clients[t2].completions.create(model=base, prompt="Hi there", max_tokens=6, extra_body={"ignore_eos": True})
    tokens[t2] += r.usage.total_tokens
    server.ctx.ledger.flush()

    # Usage over time: one line per tenant and per adapter, its points the API's numbers.
    page.goto(f"{server.url}/admin/#/usage")
    by_tenant = page.get_by_role("img", name="Tokens per hour by tenant")
    expect(by_tenant.locator(f'polyline[data-name="{names[0]}"]')).to_have_count(1)
    expect(by_tenant.locator(f'polyline[data-name="{names[1]}"]')).to_have_count(1)
    point = by_tenant.locator("circle title", has_text=f"{names[1]}: {tokens[t2]} at").first
    expect(point).to_have_count(1)
    expect(
        page.get_by_role("img", name="Tokens per hour by adapter").locator(f'polyline[data-name="{ada}"]')
    ).to_have_count(1)
    with server.admin() as c:
        series = c.get("/admin/v1/usage/series", params={"by": "tenant", "tenant_id": t1}).json()["data"]
    assert sum(p["prompt_tokens"] + p["completion_tokens"] for p in series) == tokens[t1]
    page.get_by_label("Chart", exact=True).select_option("requests")
    page.get_by_role("button", name="Draw charts").click()
    expect(
        page.get_by_role("img", name="Requests per hour by tenant").locator(
            "circle title", has_text=f"{names[0]}: 2 at"
        )
    ).to_have_count(1)
    screenshot(page, "usage-charts", tmp_path)

    # Live batch: both tenants generating; the charts follow the engine's stats.
    stop = threading.Event()

    def load(t: str) -> None:
        while not stop.is_set():
            clients[t].completions.create(
                model=base, prompt="The quick brown fox", max_tokens=24, extra_body={"ignore_eos": True}
            )

    threads = [threading.Thread(target=load, args=(t,), daemon=True) for t in (t1, t2, t2)]
    for th in threads:
        th.start()
    try:
        page.goto(f"{server.url}/admin/#/engine")
        running = page.get_by_role("img", name="Running sequences by tenant")
        expect(running.locator(f'rect[data-name="{names[1]}"]')).to_have_count(1, timeout=30_000)
        share = page.get_by_role("img", name="Share of service per refresh (solid) vs weight share (dashed)")
        expect(share.locator(f'polyline[data-name="{names[1]} weight share"]')).to_have_count(1, timeout=30_000)
        expect(
            page.get_by_role("img", name="Engine step time split (since last refresh)").locator(
                'rect[data-name="forward"]'
            )
        ).to_have_count(1)
        screenshot(page, "engine-charts", tmp_path)
    finally:
        stop.set()
        for th in threads:
            th.join(120)

    # Quota consumption on the tenant page = the limiter's and the usage table's numbers.
    with server.admin() as c:
        cons = c.get(f"/admin/v1/tenants/{t1}/quota/consumption").json()
    page.goto(f"{server.url}/admin/#/tenants/{t1}")
    expect(page.locator('[data-meter="Requests in the last minute"]')).to_have_text(
        f"{cons['requests_last_minute']} of 100"
    )
    assert cons["requests_last_minute"] >= 3 and cons["budget_used"] >= tokens[t1]
    expect(page.get_by_label("Token budget used this day")).to_be_visible()
    screenshot(page, "tenant-quota", tmp_path)
