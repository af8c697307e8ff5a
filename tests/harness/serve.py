"""``loraplex serve`` in a process of its own, for tests and benchmarks: written once.

``ServeProcess`` starts the CLI on a free loopback port with its own data dir and log, waits (a
generous deadline, polling) until ``/health`` answers, and can be killed (SIGKILL: what a crash
looks like) or stopped (SIGINT: a clean shutdown). ``harness.ray.ServeCluster`` is the same
process with ``--replicas N`` on a local Ray of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harness import HarnessError
from harness.net import free_port

SMALL_KV = "[engine]\nkv_cache_memory_gb = 0.1\n"  # several servers share the machine


class ServeProcess:
    def __init__(
        self,
        data_dir: Path,
        model_dir: Path | None,
        *,
        admin_key: str | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        config: str | None = SMALL_KV,
        args: tuple[str, ...] = (),
        # A loaded 2-core machine can take minutes to import torch (a clean clone at load ~17 took
        # over 180 s); a process that dies is seen at once (poll), so a long ceiling costs nothing.
        start_timeout: float = 600,
        new_session: bool = False,
        python: str = sys.executable,  # a benchmark may serve another checkout's venv
        clean_env: bool = False,  # drop inherited LORAPLEX_* settings (LORAPLEX_TEST_* stay): defaults only
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log = self.data_dir.parent / f"serve-{self.port}-{time.time_ns()}.log"
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not clean_env or not k.startswith("LORAPLEX_") or k.startswith("LORAPLEX_TEST")
        }
        full_env = {**inherited, "PYTHONUNBUFFERED": "1", **(env or {})}
        if model_dir is not None:
            full_env["LORAPLEX_ENGINE__MODEL"] = str(model_dir)
        if admin_key is not None:
            full_env["LORAPLEX_ADMIN_KEY"] = admin_key
        cmd = [python, "-m", "loraplex.platform.cli", "serve"]
        if config is not None:
            config_file = self.data_dir.parent / f"serve-{self.port}.toml"
            config_file.write_text(config)
            cmd += ["--config", str(config_file)]
        cmd += ["--data-dir", str(self.data_dir), "--port", str(self.port), *args]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=new_session
            )
        self._wait_ready(start_timeout)

    def is_ready(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarnessError(f"serve exited ({self.proc.returncode}):\n{self.output()[-4000:]}")
            if self.is_ready():
                return
            time.sleep(0.2)
        self.kill()
        raise HarnessError(f"serve did not come up in {timeout:.0f} s:\n{self.output()[-4000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no flush."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self, timeout: float = 30) -> None:
        """SIGINT (a clean shutdown), SIGKILL if it does not end within ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
