"""The tenant page's budget in currency in real Chromium: set through the form (a refused amount's
message shown as the server wrote it), a real request served, and the period's spend shown as the
admin API computes it (exact decimal text); then removed."""

from __future__ import annotations

import openai
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # conftest's _need_browser skips every test here (or fails it in CI)
    expect = None

from ui_helpers import api_tenant, screenshot, unique

pytestmark = pytest.mark.slow  # a browser


def test_tenant_budget_set_spent_and_removed(signed_in, server, tmp_path):
    page = signed_in
    t = api_tenant(server, unique("budget"))
    with server.admin() as c:
        key = c.post(f"/admin/v1/tenants/{t['id']}/keys", json={}).json()["key"]
        c.post("/admin/v1/prices", json={"model": "*", "input_per_mtok": "1", "output_per_mtok": "2"})
    page.goto(f"{server.url}/admin/#/tenants/{t['id']}")
    form = page.get_by_role("form", name="Budget in currency")
    expect(page.locator("[data-budget-spend]")).to_contain_text("No budget")

    form.get_by_label("Budget amount").fill("1e3")
    form.get_by_role("button", name="Save budget").click()
    expect(page.get_by_role("alert")).to_contain_text("amount must be a non-negative decimal string")

    form.get_by_label("Budget amount").fill("12.5")
    form.get_by_label("Budget reset").select_option("daily")
    form.get_by_label("Budget timezone").fill("Europe/Paris")
    form.get_by_role("button", name="Save budget").click()
    expect(page.get_by_role("status")).to_contain_text("Budget of")
    with server.admin() as c:
        b = c.get(f"/admin/v1/tenants/{t['id']}/budget").json()
    assert (b["amount"], b["period"], b["timezone"]) == ("12.5", "daily", "Europe/Paris")

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)
    client.completions.create(model=server.ctx.engine.model_name, prompt="The quick brown fox", max_tokens=6)
    server.ctx.budgets.flush()
    with server.admin() as c:
        spent = c.get(f"/admin/v1/tenants/{t['id']}/budget").json()["spent"]
    assert spent != "0"
    page.get_by_role("button", name="Refresh budget").click()
    expect(page.locator("[data-budget-spent]")).to_have_attribute("data-budget-spent", spent)
    expect(page.locator("[data-budget-spent]")).to_contain_text(f"{spent} of 12.5 USD")
    screenshot(page, "admin-budget", tmp_path)

    page.reload()
    expect(page.get_by_role("form", name="Budget in currency").get_by_label("Budget amount")).to_have_value("12.5")
    page.get_by_role("form", name="Budget in currency").get_by_role("button", name="Remove budget").click()
    page.get_by_role("dialog").get_by_role("button", name="Remove budget").click()
    expect(page.get_by_role("status")).to_contain_text("removed")
    with server.admin() as c:
        assert c.get(f"/admin/v1/tenants/{t['id']}/budget").status_code == 404
