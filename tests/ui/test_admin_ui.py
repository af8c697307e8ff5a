"""The admin web page in a real browser, against the real platform: every check that matters is
confirmed through the admin API (or the tenant API) too, not just on screen."""

from __future__ import annotations

import re

import httpx
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # conftest's _need_browser skips every test here (or fails it in CI)
    expect = None

from harness.wait import wait_for
from platform_helpers import ADMIN_KEY, targz_bytes, zip_bytes
from ui_helpers import api_tenant, screenshot, unique

pytestmark = pytest.mark.slow  # a browser


def open_tenant(page, server, tenant: dict) -> None:
    page.goto(f"{server.url}/admin/#/tenants/{tenant['id']}")
    expect(page.get_by_role("heading", name=f"Tenant {tenant['name']}")).to_be_visible()


def alert(page):
    return page.get_by_role("alert")


def test_sign_in_wrong_key_then_right_key(page, server, tmp_path):
    page.goto(server.url + "/admin")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Admin key").fill("not-the-key")
    page.get_by_role("button", name="Sign in").click()
    expect(alert(page)).to_contain_text("invalid admin key")
    expect(alert(page)).to_contain_text("HTTP 401")
    expect(page.get_by_role("navigation", name="Main")).to_be_hidden()

    page.get_by_label("Admin key").fill(ADMIN_KEY)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Tenants", exact=True)).to_be_visible()
    expect(alert(page)).to_be_hidden()
    # Kept for this tab only, never in the address bar.
    assert page.evaluate("sessionStorage.getItem('loraplex.adminKey')") == ADMIN_KEY
    assert ADMIN_KEY not in page.url
    page.reload()
    expect(page.get_by_role("heading", name="Tenants", exact=True)).to_be_visible()
    screenshot(page, "tenants", tmp_path)

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('loraplex.adminKey')") is None


def test_tenant_key_is_refused_as_admin_key(page, server):
    t = api_tenant(server, unique("keyed"))
    with server.admin() as c:
        key = c.post(f"/admin/v1/tenants/{t['id']}/keys", json={}).json()["key"]
    page.goto(server.url + "/admin")
    page.get_by_label("Admin key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(alert(page)).to_contain_text("this is a tenant API key; the admin API needs an admin key")


def test_create_edit_delete_tenant(signed_in, server):
    page = signed_in
    name = unique("acme")
    form = page.get_by_role("form", name="Create tenant")
    form.get_by_label("Name").fill(name)
    form.get_by_label("Priority class").fill("2")
    form.get_by_label("Weight").fill("1.5")
    form.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("status")).to_contain_text(f"Tenant {name} created.")
    row = page.get_by_role("row").filter(has_text=name)
    expect(row).to_contain_text("1.5")
    with server.admin() as c:
        created = next(
            t for t in c.get("/admin/v1/tenants", params={"limit": 1000}).json()["data"] if t["name"] == name
        )
    assert (created["priority"], created["weight"], created["status"]) == (2, 1.5, "active")

    # The server's validation message reaches the user verbatim.
    form.get_by_label("Name").fill("bad name!")
    form.get_by_role("button", name="Create tenant").click()
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as c:
        expected = c.post(
            "/admin/v1/tenants", json={"name": "bad name!", "priority": 0, "weight": 1, "status": "active"}
        ).json()["error"]["message"]
    expect(alert(page).locator("#error-text")).to_have_text(expected)
    # A duplicate name: the server's conflict message.
    form.get_by_label("Name").fill(name)
    form.get_by_role("button", name="Create tenant").click()
    expect(alert(page)).to_contain_text("HTTP 409")

    page.get_by_role("link", name=f"Edit tenant {name}").click()
    settings = page.get_by_role("form", name="Tenant settings")
    expect(settings.get_by_label("Name")).to_have_value(name)
    settings.get_by_label("Weight").fill("2.5")
    settings.get_by_label("Priority class").fill("3")
    settings.get_by_label("Status").select_option("suspended")
    settings.get_by_role("button", name="Save tenant").click()
    expect(page.get_by_role("status")).to_contain_text(f"Tenant {name} saved.")
    with server.admin() as c:
        got = c.get(f"/admin/v1/tenants/{created['id']}").json()
    assert (got["priority"], got["weight"], got["status"]) == (3, 2.5, "suspended")
    # An out-of-range value is refused by the server, and the page says why.
    settings.get_by_label("Priority class").fill("12")
    settings.get_by_role("button", name="Save tenant").click()
    expect(alert(page)).to_contain_text("priority")
    expect(alert(page)).to_contain_text("HTTP 422")

    page.get_by_role("button", name="Delete tenant").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(name)
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    with server.admin() as c:
        assert c.get(f"/admin/v1/tenants/{created['id']}").status_code == 200
    page.get_by_role("button", name="Delete tenant").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete tenant").click()
    expect(page.get_by_role("heading", name="Tenants", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name=name, exact=True)).to_have_count(0)
    with server.admin() as c:
        assert c.get(f"/admin/v1/tenants/{created['id']}").status_code == 404


def test_api_key_shown_once_works_and_revokes(signed_in, server, tmp_path):
    page = signed_in
    t = api_tenant(server, unique("keys"))
    open_tenant(page, server, t)
    keys_form = page.get_by_role("form", name="Create API key")
    keys_form.get_by_label("Key name").fill("ci-key")
    keys_form.get_by_role("button", name="Create key").click()
    new_key = page.get_by_role("region", name="New API key").get_by_label(re.compile("New API key"))
    expect(new_key).to_be_visible()
    secret = new_key.input_value()
    assert len(secret) > 20
    expect(page.get_by_role("button", name="Copy key")).to_be_visible()
    row = page.get_by_role("row").filter(has_text="ci-key")
    expect(row).to_contain_text("active")
    expect(row).to_contain_text(secret[:6])
    screenshot(page, "tenant", tmp_path)

    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 200, r.text

    # Shown once: after a reload the page (and the API) only have the prefix.
    page.reload()
    expect(page.get_by_role("row").filter(has_text="ci-key")).to_be_visible()
    assert secret not in page.content()

    page.get_by_role("button", name="Revoke key ci-key").click()
    page.get_by_role("dialog").get_by_role("button", name="Revoke key").click()
    expect(page.get_by_role("row").filter(has_text="ci-key")).to_contain_text("revoked")
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 401, r.text


def test_quota_editor(signed_in, server):
    page = signed_in
    t = api_tenant(server, unique("quota"))
    open_tenant(page, server, t)
    quota = page.get_by_role("form", name="Quota")
    expect(quota.get_by_label("Requests per minute")).to_have_value("")
    quota.get_by_label("Requests per minute").fill("60")
    quota.get_by_label("Tokens per minute").fill("5000")
    quota.get_by_label("Max concurrent requests").fill("2")
    quota.get_by_label("Token budget").fill("100000")
    quota.get_by_label("Budget period").select_option("day")
    quota.get_by_role("button", name="Save quota").click()
    expect(page.get_by_role("status")).to_contain_text("Quota of")
    with server.admin() as c:
        q = c.get(f"/admin/v1/tenants/{t['id']}/quota").json()
    assert (q["rpm"], q["tpm"], q["max_concurrent"], q["token_budget"], q["budget_period"]) == (
        60,
        5000,
        2,
        100000,
        "day",
    )

    quota.get_by_label("Requests per minute").fill("")
    quota.get_by_role("button", name="Save quota").click()
    # the status still says "Quota of ..." from the first save, so it cannot tell when the second
    # one landed (beside two CPU burners the read came first: 60): wait for the stored value
    with server.admin() as c:
        wait_for(
            lambda: c.get(f"/admin/v1/tenants/{t['id']}/quota").json()["rpm"] is None,
            timeout=60,
            what="the cleared rpm saved",
        )
    page.reload()
    expect(page.get_by_role("form", name="Quota").get_by_label("Tokens per minute")).to_have_value("5000")


def _upload(page, name: str, file_name: str, data: bytes, owner: str | None, mime="application/zip") -> None:
    form = page.get_by_role("form", name="Upload adapter")
    form.get_by_label("Adapter name").fill(name)
    form.get_by_label("Adapter archive").set_input_files({"name": file_name, "mimeType": mime, "buffer": data})
    if owner is None:
        form.get_by_label("Visibility").select_option("shared")
    else:
        form.get_by_label("Visibility").select_option("private")
        form.get_by_label("Owner tenant").select_option(label=owner)
    form.get_by_role("button", name="Upload adapter").click()


def test_adapter_upload_list_grants_and_errors(signed_in, server, ui_adapter_files, tmp_path):
    page = signed_in
    owner = api_tenant(server, unique("owner"))
    other = api_tenant(server, unique("other"))
    name = unique("bot")
    page.get_by_role("link", name="Adapters").click()
    expect(page.get_by_role("heading", name="Adapters", exact=True)).to_be_visible()
    expect(page.get_by_role("form", name="Upload adapter").get_by_label("Owner tenant")).to_contain_text(owner["name"])
    _upload(page, name, "bot.zip", zip_bytes(ui_adapter_files), owner["name"])
    expect(page.get_by_role("status")).to_contain_text(f"Adapter {name} v1 uploaded (rank 4)")
    with server.admin() as c:
        ada = next(a for a in c.get("/admin/v1/adapters").json()["data"] if a["name"] == name)
    row = page.get_by_role("row").filter(has_text=name)
    expect(row).to_contain_text("q_proj, v_proj")
    expect(row).to_contain_text(ada["sha256"])
    expect(row).to_contain_text(owner["name"])
    expect(row).to_contain_text(ada["status"])
    expect(row.get_by_role("cell").nth(4)).to_have_text("4")  # rank

    # Grants: add, then remove.
    row.get_by_label(f"Tenant to grant {name} v1").select_option(label=other["name"])
    row.get_by_role("button", name=f"Add grant on {name} v1").click()
    expect(page.get_by_role("status")).to_contain_text(f"{other['name']} may now use {name}")
    with server.admin() as c:
        assert c.get(f"/admin/v1/adapters/{ada['id']}").json()["granted_tenant_ids"] == [other["id"]]
    page.get_by_role("button", name=f"Remove grant for {other['name']} on {name} v1").click()
    expect(page.get_by_role("status")).to_contain_text(f"{other['name']} may no longer use {name}")
    with server.admin() as c:
        assert c.get(f"/admin/v1/adapters/{ada['id']}").json()["granted_tenant_ids"] == []
    # A new version from a .tar.gz: both versions listed when superseded ones are shown.
    form = page.get_by_role("form", name="Upload adapter")
    form.get_by_label("Upload as a new version of an existing name").check()
    _upload(page, name, "bot-v2.tar.gz", targz_bytes(ui_adapter_files), owner["name"], mime="application/gzip")
    expect(page.get_by_role("status")).to_contain_text(f"Adapter {name} v2 uploaded")
    expect(page.get_by_role("row").filter(has_text=name)).to_have_count(1)
    page.get_by_label("Show superseded versions").check()
    expect(page.get_by_role("row").filter(has_text=name)).to_have_count(2)
    page.get_by_label("Show superseded versions").uncheck()
    expect(page.get_by_role("row").filter(has_text=name)).to_have_count(1)
    screenshot(page, "adapters", tmp_path)

    # Not an archive: the server's own message, verbatim.
    bogus = b"this is not a zip file at all"
    with server.admin() as c:
        r = c.post(
            "/admin/v1/adapters", data={"name": "bogus", "tenant_id": owner["id"]}, files={"file": ("bogus.zip", bogus)}
        )
        assert r.status_code >= 400
        expected = r.json()["error"]["message"]
    _upload(page, "bogus", "bogus.zip", bogus, owner["name"])
    expect(alert(page).locator("#error-text")).to_have_text(expected)
    # A private adapter without an owner: refused by the server, message shown.
    _upload(page, unique("shared"), "bot.zip", zip_bytes(ui_adapter_files), None)  # shared: no owner needed
    expect(page.get_by_role("status")).to_contain_text("v1 uploaded")
    expect(alert(page)).to_be_hidden()
    form = page.get_by_role("form", name="Upload adapter")
    form.get_by_label("Adapter name").fill(unique("orphan"))
    form.get_by_label("Adapter archive").set_input_files(
        {"name": "a.zip", "mimeType": "application/zip", "buffer": zip_bytes(ui_adapter_files)}
    )
    form.get_by_role("button", name="Upload adapter").click()
    expect(alert(page)).to_contain_text("a private adapter needs the owning tenant_id")

    page.get_by_role("button", name=f"Delete adapter {name} v2").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete adapter").click()
    expect(page.get_by_role("status")).to_contain_text(f"Adapter {name} v2 deleted.")
    with server.admin() as c:
        left = [
            a
            for a in c.get("/admin/v1/adapters", params={"include_superseded": True}).json()["data"]
            if a["name"] == name
        ]
    assert [a["version"] for a in left] == [1]


def test_engine_view_usage_and_audit(signed_in, server, tmp_path):
    page = signed_in
    t = api_tenant(server, unique("live"))
    with server.admin() as c:
        key = c.post(f"/admin/v1/tenants/{t['id']}/keys", json={}).json()["key"]
        base = c.get("/admin/v1/engine").json()["model"]
    with httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
        r = c.post("/v1/completions", json={"model": base, "prompt": "Hello there", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text

    page.get_by_role("link", name="Engine").click()
    expect(page.get_by_role("heading", name="Engine", exact=True)).to_be_visible()
    expect(page.get_by_text(base, exact=True)).to_be_visible()
    expect(page.get_by_text("Batch size (running)")).to_be_visible()
    expect(page.get_by_text("KV cache use")).to_be_visible()
    expect(
        page.get_by_role("table", name="Per-tenant scheduling").get_by_role("row").filter(has_text=t["name"])
    ).to_be_visible()
    expect(page.get_by_label("Auto-refresh every 3 s")).to_be_checked()
    # It refreshes by itself.
    stamp = page.get_by_text(re.compile(r"^Updated "))
    first = stamp.text_content()
    expect(stamp).not_to_have_text(first, timeout=10_000)
    screenshot(page, "engine", tmp_path)

    page.get_by_role("link", name="Usage").click()
    usage = page.get_by_role("form", name="Usage filter")
    usage.get_by_label("Tenant").select_option(label=t["name"])
    usage.get_by_label("Group by").select_option("adapter")
    # Usage records are written asynchronously in batches: retry until the request shows up.
    for _ in range(40):
        usage.get_by_role("button", name="Show usage").click()
        totals = page.locator(".totals")
        expect(totals).to_be_visible()
        if totals.text_content().startswith("Totals: 1 requests"):
            break
        page.wait_for_timeout(250)
    expect(page.locator(".totals")).to_contain_text("Totals: 1 requests, 0 errors")
    expect(page.get_by_role("row").filter(has_text="(base model)")).to_be_visible()
    # Export: every record of the selection as a CSV file (the same rows as the API's export).
    with page.expect_download() as download:
        usage.get_by_role("button", name="Export CSV").click()
    exported = open(download.value.path()).read()
    assert download.value.suggested_filename == "usage.csv"
    header = exported.splitlines()[0].split(",")
    # The API export's columns, in its order (http_request_id is the client's x-request-id).
    assert header[:3] == ["request_id", "http_request_id", "created_at"]
    assert {"tenant_id", "adapter_name", "prompt_tokens", "completion_tokens", "status"} <= set(header)
    assert r.json()["id"].removeprefix("cmpl-") in exported and t["id"] in exported

    page.get_by_role("link", name="Audit log").click()
    audit = page.get_by_role("form", name="Audit filter")
    audit.get_by_label("Target ID").fill(t["id"])
    audit.get_by_role("button", name="Show entries").click()
    expect(page.get_by_role("row").filter(has_text="tenant.create").filter(has_text=t["id"])).to_have_count(1)
    expect(page.get_by_role("row").filter(has_text="tenant.create")).to_have_count(1)  # filtered to this tenant
