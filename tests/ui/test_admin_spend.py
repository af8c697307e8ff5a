"""The admin page's Spend view in real Chromium: a price added through the form, a real request
served after it, and the spend table, chart and CSV export showing the exact cost the admin API
computes (decimal text, no rounding), plus a refused price's message shown as the server wrote it."""

from __future__ import annotations

import csv
import io

import openai
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # conftest's _need_browser skips every test here (or fails it in CI)
    expect = None

from ui_helpers import screenshot, unique

pytestmark = pytest.mark.slow  # a browser


def test_spend_view_prices_and_shows_exact_cost(signed_in, server, tmp_path):
    page = signed_in
    name = unique("payer")
    with server.admin() as c:
        tid = c.post("/admin/v1/tenants", json={"name": name}).json()["id"]
        key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
    base = server.ctx.engine.model_name
    page.get_by_role("link", name="Spend").click()
    expect(page.get_by_role("heading", name="Spend", exact=True)).to_be_visible()

    # a refused price: the server's message, verbatim
    page.get_by_label("Input per 1M tokens", exact=True).fill("-1")
    page.get_by_label("Output per 1M tokens").fill("1")
    page.get_by_role("button", name="Add price").click()
    expect(page.get_by_role("alert")).to_contain_text("input_per_mtok must be a non-negative decimal")

    page.get_by_label("Model", exact=True).fill(base)
    page.get_by_label("Input per 1M tokens", exact=True).fill("0.25")
    page.get_by_label("Cached input per 1M tokens").fill("0.05")
    page.get_by_label("Output per 1M tokens").fill("1.125")
    page.get_by_role("button", name="Add price").click()
    book = page.get_by_role("table", name="Price book")
    expect(book.get_by_role("row").filter(has_text="1.125")).to_have_count(1)

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)
    client.completions.create(model=base, prompt="The quick brown fox", max_tokens=6)
    server.ctx.ledger.flush()
    with server.admin() as c:
        want = c.get("/admin/v1/spend", params={"group_by": "tenant", "tenant_id": tid}).json()["data"][0]["cost"]
    assert want != "0"

    page.get_by_label("Tenant", exact=True).select_option(label=name)
    page.get_by_role("button", name="Show spend").click()
    expect(page.locator("[data-total-cost]")).to_have_attribute("data-total-cost", want)
    row = page.get_by_role("table", name="Spend by tenant").get_by_role("row").filter(has_text=name)
    expect(row).to_contain_text(want)
    expect(page.get_by_role("img", name="Spend by tenant (USD)")).to_have_attribute("data-parts", "1")
    screenshot(page, "admin-spend", tmp_path)

    with page.expect_download() as download:
        page.get_by_role("button", name="Export CSV").click()
    assert download.value.suggested_filename == "spend.csv"
    rows = list(csv.DictReader(io.StringIO(open(download.value.path()).read())))
    assert [(r["tenant_id"], r["cost"]) for r in rows] == [(tid, want)]
