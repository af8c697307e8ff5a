"""`loraplex serve` for real: a uvicorn process, a generated admin key printed once, state kept
across a restart."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from harness.serve import ServeProcess
from platform_helpers import zip_bytes

pytestmark = pytest.mark.slow  # a real `loraplex serve` process


def serve_without_admin_key(data_dir: Path, model_dir: Path) -> ServeProcess:
    """``loraplex serve`` with no admin key configured (it makes one and prints it), defaults only."""
    return ServeProcess(data_dir, model_dir, config=None, clean_env=True, start_timeout=300)


def test_serve_first_start_and_restart(tmp_path, demo_model_dir, good_files):
    data = tmp_path / "data"
    server = serve_without_admin_key(data, demo_model_dir)
    try:
        match = re.search(r"(lpx-admin-\S+)", server.output())
        assert match, server.output()
        admin = {"Authorization": f"Bearer {match.group(1)}"}
        with httpx.Client(base_url=server.url, headers=admin, timeout=30) as c:
            tid = c.post("/admin/v1/tenants", json={"name": "acme"}).json()["id"]
            key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
            r = c.post(
                "/admin/v1/adapters",
                data={"name": "bot", "tenant_id": tid},
                files={"file": ("bot.zip", zip_bytes(good_files))},
            )
            assert r.status_code == 201, r.text
            ada = r.json()["id"]
    finally:
        server.stop()
    assert (data / "loraplex.db").exists() and (data / "adapters").is_dir()

    again = serve_without_admin_key(data, demo_model_dir)
    try:
        assert "lpx-admin-" not in again.output()  # printed once, on the first start only
        with httpx.Client(base_url=again.url, headers=admin, timeout=30) as c:
            state = c.get("/admin/v1/engine").json()
            assert ada in state["registered_adapters"] and ada in state["lora"]["registered"]
            models = httpx.get(again.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
            assert [m["id"] for m in models["data"]][-1] == "bot"
    finally:
        again.stop()
