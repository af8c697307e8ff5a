"""A real Prometheus (Debian's ``prometheus`` binary) for tests: its own loopback port, data dir and
config, a short scrape and rule-evaluation interval, stopped with everything it wrote."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import httpx

from .net import free_port
from .process import ServerProcess
from .wait import WaitTimeout, wait_for


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class PrometheusProcess(ServerProcess):
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
        port = free_port()
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
        super().__init__(
            [
                binary,
                f"--config.file={self.folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
            ],
            port=port,
            log=self.folder / "prometheus.log",
            ready_path="/-/ready",
            start_timeout=start_timeout,
        )

    @property
    def name(self) -> str:
        return "prometheus"

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now: the result vector (raises on a query error, e.g. bad PromQL)."""
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=30)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query failed ({r.status_code}): {expr}\n{body}")
        return body["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 120) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns series (scrapes and rule evaluations are periodic); [] if
        none came within ``timeout`` (the caller's assertion says what was missing)."""
        try:
            return wait_for(lambda: self.query(expr), timeout=timeout, interval=0.5, what=expr)
        except WaitTimeout:
            return []

    def stop(self, timeout: float = 30, sig: int = signal.SIGTERM) -> None:
        super().stop(timeout, sig)
