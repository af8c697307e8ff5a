"""Helpers shared by the admin UI tests."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

# Where a screenshot of each main view is also copied (looked at by a human; not asserted on).
SCREENSHOT_DIR = os.environ.get("LORAPLEX_UI_SCREENSHOT_DIR", "")


def sign_in(page, url: str, key: str) -> None:
    from playwright.sync_api import expect

    page.goto(url + "/admin")
    page.get_by_label("Admin key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Tenants", exact=True)).to_be_visible()


def screenshot(page, name: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if SCREENSHOT_DIR:
        os.makedirs(SCREENSHOT_DIR, exist_ok=True)
        shutil.copy(path, Path(SCREENSHOT_DIR) / path.name)
    return path


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def api_tenant(server, name: str) -> dict:
    with server.admin() as c:
        r = c.post("/admin/v1/tenants", json={"name": name})
        assert r.status_code == 201, r.text
        return r.json()
