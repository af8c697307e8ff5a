"""The admin page registers an adapter by reference (a file:// folder) and lists its source."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect
from ui_helpers import api_tenant, unique

pytestmark = pytest.mark.slow


def test_register_by_uri_from_the_admin_page(signed_in, server, ui_adapter_files, tmp_path):
    page = signed_in
    folder = tmp_path / "adapter"
    folder.mkdir()
    for name, data in ui_adapter_files.items():
        (folder / name).write_bytes(data)
    owner = api_tenant(server, unique("owner"))
    name = unique("ref")
    page.get_by_role("link", name="Adapters").click()
    form = page.get_by_role("form", name="Register adapter by reference")
    expect(form.get_by_label("Owner tenant")).to_contain_text(owner["name"])
    form.get_by_label("Adapter name").fill(name)
    form.get_by_label("Source URI").fill(f"file://{folder}")
    form.get_by_label("Visibility").select_option("private")
    form.get_by_label("Owner tenant").select_option(label=owner["name"])
    form.get_by_role("button", name="Register adapter").click()
    expect(page.get_by_role("status")).to_contain_text(f"Adapter {name} v1 registered from file://{folder} (rank 4)")
    with server.admin() as c:
        ada = next(a for a in c.get("/admin/v1/adapters").json()["data"] if a["name"] == name)
    assert ada["source_uri"] == f"file://{folder}" and ada["owner_tenant_id"] == owner["id"]
    row = page.get_by_role("row").filter(has_text=name)
    expect(row).to_contain_text(f"file://{folder}")
    expect(row).to_contain_text(ada["sha256"])
    # a refused reference shows the server's message, and registers nothing
    form.get_by_label("Adapter name").fill(unique("bad"))
    form.get_by_label("Source URI").fill("ftp://nowhere/x")
    form.get_by_label("Visibility").select_option("shared")
    form.get_by_role("button", name="Register adapter").click()
    expect(page.get_by_role("alert")).to_contain_text("unsupported source")
