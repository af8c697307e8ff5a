"""`loraplex serve` for real: a uvicorn process, a generated admin key printed once, state kept
across a restart."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from platform_helpers import zip_bytes

pytestmark = pytest.mark.slow  # a real `loraplex serve` process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, data_dir: Path, model_dir: Path) -> None:
        self.port = _free_port()
        env = {**os.environ, "LORAPLEX_ENGINE__MODEL": str(model_dir), "PYTHONUNBUFFERED": "1"}
        env.pop("LORAPLEX_ADMIN_KEY", None)
        self.log = data_dir.parent / f"serve-{self.port}.log"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loraplex.platform.cli",
                "serve",
                "--data-dir",
                str(data_dir),
                "--port",
                str(self.port),
            ],
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"serve exited: {self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        pytest.fail("serve did not come up")

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def test_serve_first_start_and_restart(tmp_path, demo_model_dir, good_files):
    data = tmp_path / "data"
    server = Server(data, demo_model_dir)
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

    again = Server(data, demo_model_dir)
    try:
        assert "lpx-admin-" not in again.output()  # printed once, on the first start only
        with httpx.Client(base_url=again.url, headers=admin, timeout=30) as c:
            state = c.get("/admin/v1/engine").json()
            assert ada in state["registered_adapters"] and ada in state["lora"]["registered"]
            models = httpx.get(again.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
            assert [m["id"] for m in models["data"]][-1] == "bot"
    finally:
        again.stop()
