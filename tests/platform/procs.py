"""Real processes for fault tests: ``loraplex serve`` (killed with SIGKILL, restarted on the same
data dir) and a private PostgreSQL server (stopped and started under load)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from platform_helpers import ADMIN_KEY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    def __init__(
        self, data_dir: Path, model_dir: Path, *, env: dict[str, str] | None = None, port: int | None = None
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"serve-{self.port}-{time.time_ns()}.log"
        full_env = {
            **os.environ,
            "LORAPLEX_ENGINE__MODEL": str(model_dir),
            "LORAPLEX_ADMIN_KEY": ADMIN_KEY,
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        config = data_dir.parent / "serve-test.toml"  # a small KV cache: several servers share the machine
        config.write_text("[engine]\nkv_cache_memory_gb = 0.1\n")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loraplex.platform.cli",
                "serve",
                "--config",
                str(config),
                "--data-dir",
                str(data_dir),
                "--port",
                str(self.port),
            ],
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            env=full_env,
        )
        deadline = time.time() + 180  # a loaded 2-core machine can take a while to import torch
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"serve exited ({self.proc.returncode}):\n{self.output()[-4000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        pytest.fail("serve did not come up in 180 s:\n" + self.output()[-4000:])

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no flush: what a crash looks like."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


class PgCluster:
    """A PostgreSQL server of our own (so stopping it disturbs no other test)."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        if self.bin is None or os.geteuid() != 0 or shutil.which("runuser") is None:
            if os.environ.get("LORAPLEX_REQUIRE_POSTGRES") == "1":
                pytest.fail("PostgreSQL binaries (run as root) are required for the outage test")
            pytest.skip("needs PostgreSQL server binaries and root (runuser)")
        self.dir = Path(tempfile.mkdtemp(prefix="lpx-pg-"))
        shutil.chown(self.dir, "postgres")
        self.port = free_port()
        self._pg("initdb", "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres")
        self.start()
        subprocess.run(
            [
                str(self.bin / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-qc",
                "create database loraplex",
            ],
            check=True,
            capture_output=True,
        )
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/loraplex"

    def _pg(self, tool: str, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bin / tool), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        self._pg(
            "pg_ctl",
            "-D",
            str(self.dir / "data"),
            "-l",
            str(self.dir / "log"),
            "-w",
            "-o",
            f"-k {self.dir} -p {self.port} -c listen_addresses=127.0.0.1",
            "start",
        )

    def stop(self, mode: str = "immediate") -> None:
        self._pg("pg_ctl", "-D", str(self.dir / "data"), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        try:
            self.stop("fast")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def statuses_on_one_connection(url: str, path: str, token: str, n: int = 2) -> list[int | None]:
    """Send ``n`` GETs over ONE keep-alive connection (a raw socket, so nothing reconnects behind
    our back); None where the server had closed the connection instead of answering."""
    host, port = url.removeprefix("http://").split(":")
    out: list[int | None] = []
    with socket.create_connection((host, int(port)), timeout=15) as sock, sock.makefile("rb") as f:
        for _ in range(n):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
            status = f.readline()
            if not status:
                out.append(None)
                break
            length = 0
            while line := f.readline().strip():
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            f.read(length)
            out.append(int(status.split()[1]))
    return out
