"""A real ``loraplex serve --replicas N`` process tree for the scale-out tests: started once per
test module (Ray and its replicas take a minute to start on a busy 2-core box), stopped with its
whole process group."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from billing_helpers import H
from platform_helpers import ADMIN_KEY

START_TIMEOUT_S = 300  # Ray + replicas on a loaded 2-core machine


def _serve_port() -> int:
    """A free port below the kernel's ephemeral range (32768+) and above Ray's worker ports
    (10002-19999): Ray's own processes take ephemeral ports while Serve's proxy starts, and one of
    them could take a port picked from that range before the proxy binds it."""
    for _ in range(200):
        port = random.randint(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-30000")


class Cluster:
    """``config``: a TOML text, or None for the default configuration (``--replicas`` only)."""

    def __init__(self, root: Path, model_dir: Path, config: str | None, replicas: int = 2) -> None:
        self.port = _serve_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.root = root
        self.expected = replicas
        args = ["--replicas", str(replicas)]
        if config is not None:
            (root / "cluster.toml").write_text(config)
            args = ["--config", str(root / "cluster.toml")]
        self.log = root / "cluster.log"
        env = {
            **os.environ,
            "LORAPLEX_ENGINE__MODEL": str(model_dir),
            "LORAPLEX_ADMIN_KEY": ADMIN_KEY,
            "PYTHONUNBUFFERED": "1",
            "RAY_DEDUP_LOGS": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loraplex.platform.cli",
                "serve",
                *args,
                "--data-dir",
                str(root / "data"),
                "--port",
                str(self.port),
            ],
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"serve --replicas {replicas} exited ({self.proc.returncode}):\n{self.output()[-4000:]}")
            if "loraplex serving on" in self.output() and len(self.replicas()) == replicas:
                return
            time.sleep(0.5)
        self.stop()
        pytest.fail(f"the cluster did not come up in {START_TIMEOUT_S} s:\n" + self.output()[-4000:])

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def engine(self) -> dict:
        return httpx.get(self.url + "/admin/v1/engine", headers=H, timeout=10).json()

    def replicas(self) -> list[dict]:
        try:
            return self.engine().get("replicas", [])
        except (httpx.HTTPError, ValueError):
            return []

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever is left of this run's Ray processes (same process group, not other runs')
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
