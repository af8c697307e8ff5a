"""The admin page's projects (under a tenant) in real Chromium: create one through the form,
see it listed, edit its limits and models, create a key of it (the key works and is limited to the
project's models), a refused name shown as the server wrote it, and archive it (its key is then
refused)."""

from __future__ import annotations

import httpx
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # conftest's _need_browser skips every test here (or fails it in CI)
    expect = None

from ui_helpers import api_tenant, screenshot, unique

pytestmark = pytest.mark.slow  # a browser


def test_projects_under_a_tenant_create_edit_key_archive(signed_in, server, tmp_path):
    page = signed_in
    t = api_tenant(server, unique("proj"))
    base = server.ctx.engine.model_name
    page.goto(f"{server.url}/admin/#/tenants/{t['id']}")
    expect(page.get_by_role("heading", name=f"Tenant {t['name']}")).to_be_visible()

    form = page.get_by_role("form", name="Create project")
    form.get_by_label("Project name").fill("search")
    form.get_by_label("Project requests per minute").fill("30")
    form.get_by_label("Project weight").fill("3")
    form.get_by_role("button", name="Create project").click()
    projects = page.get_by_role("table", name="Projects")
    row = projects.get_by_role("row").filter(has_text="search")
    expect(row).to_contain_text("30")
    expect(row).to_contain_text("3")
    with server.admin() as c:
        listed = c.get(f"/admin/v1/tenants/{t['id']}/projects").json()["data"]
    assert [(p["name"], p["rpm"], p["weight"], p["models"]) for p in listed] == [("search", 30, 3.0, None)]
    pid = listed[0]["id"]

    # a second project of the same name: the server's refusal, verbatim
    form.get_by_label("Project name").fill("search")
    form.get_by_role("button", name="Create project").click()
    expect(page.get_by_role("alert")).to_contain_text("already has a project named 'search'")

    # edit: models and a cleared limit
    page.get_by_role("button", name="Edit project search").click()
    edit = page.get_by_role("form", name="Edit project search")
    edit.get_by_label("Project models").fill(base)
    edit.get_by_label("Project requests per minute").fill("")
    edit.get_by_role("button", name="Save project").click()
    expect(row).to_contain_text(base)
    with server.admin() as c:
        p = c.get(f"/admin/v1/projects/{pid}").json()
    assert (p["models"], p["rpm"], p["weight"]) == ([base], None, 3.0)

    # a key of the project: created through the key form's project picker
    keys_form = page.get_by_role("form", name="Create API key")
    keys_form.get_by_label("Key name").fill("team-key")
    keys_form.get_by_label("Project", exact=True).select_option(label="search")
    keys_form.get_by_role("button", name="Create key").click()
    secret = page.get_by_role("region", name="New API key").get_by_role("textbox").input_value()
    expect(page.get_by_role("table", name="API keys").get_by_role("row").filter(has_text="team-key")).to_contain_text(
        pid
    )
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {secret}"}) as c:
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [base]
    screenshot(page, "admin-projects", tmp_path)

    # archive: gone from the list, its key refused
    page.get_by_role("button", name="Archive project search").click()
    page.get_by_role("dialog").get_by_role("button", name="Archive project").click()
    expect(page.get_by_text("No projects yet")).to_be_visible()
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {secret}"}) as c:
        r = c.get("/v1/models")
        assert r.status_code == 403 and r.json()["error"]["code"] == "project_archived"
