"""A real Prometheus (Debian's ``prometheus`` binary) for tests: its own loopback port, data dir and
config, a short scrape and rule-evaluation interval, stopped with everything it wrote."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from harness.net import free_port


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class PrometheusProcess:
    def __init__(
        self,
        folder: Path,
        targets: dict[str, str],
        *,
        rule_files: tuple[Path, ...] = (),
        interval: str = "1s",
        start_timeout: float = 120,
    ) -> None:
        """``targets``: job name -> "host:port" scraped at ``interval``; ``rule_files`` evaluated
        at the same interval."""
        binary = prometheus_binary()
        if binary is None:
            raise RuntimeError("prometheus is not installed (apt-get install prometheus)")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = [
            "global:",
            f"  scrape_interval: {interval}",
            f"  scrape_timeout: {interval}",
            f"  evaluation_interval: {interval}",
        ]
        if rule_files:
            config += ["rule_files:", *(f"  - {Path(p).resolve()}" for p in rule_files)]
        config.append("scrape_configs:")
        for job, target in targets.items():
            config += [f"  - job_name: {job}", "    static_configs:", f"      - targets: ['{target}']"]
        (self.folder / "prometheus.yml").write_text("\n".join(config) + "\n")
        self.log = self.folder / "prometheus.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self.proc.returncode}):\n{self.output()[-3000:]}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus not ready in {start_timeout:.0f} s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now: the result vector (raises on a query error, e.g. bad PromQL)."""
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=30)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query failed ({r.status_code}): {expr}\n{body}")
        return body["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 120) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns series (scrapes and rule evaluations are periodic)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
