"""How the platform serves the admin page (no browser needed)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow  # a browser


def test_admin_page_is_served_with_a_strict_csp(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get("/admin")
        assert r.status_code == 307 and r.headers["location"] == "admin/"
        page = c.get("/admin/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert 'src="static/app.js"' in page.text
        js = c.get("/admin/static/app.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        for path in (
            "/admin/static/api.js",
            "/admin/static/dom.js",
            "/admin/static/style.css",
            "/admin/static/views/engine.js",
        ):
            assert c.get(path).status_code == 200, path
        # The page itself holds no data: everything comes from /admin/v1 with the admin key.
        assert c.get("/admin/v1/tenants").status_code == 401
        missing = c.get("/admin/static/nope.js")
        assert missing.status_code == 404 and missing.json()["error"]["message"]
        assert "/admin/" not in c.get("/openapi.json").json()["paths"]


def test_admin_ui_found_from_any_working_directory(tmp_path, monkeypatch):
    from loraplex.platform.app import _admin_ui_dir

    monkeypatch.chdir(tmp_path)
    ui = _admin_ui_dir()
    assert ui is not None and (ui / "index.html").is_file() and (ui / "static" / "app.js").is_file()
