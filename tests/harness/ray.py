"""``loraplex serve --replicas N`` on a local Ray of its own, for the scale-out tests and the
scale-out benchmarks: written once.

``ServeCluster`` is ``ServeProcess`` (own free port, data dir under ``root``, log) started in a
new process group, so that every Ray process of this run (the raylet, GCS, Serve's controller and
proxy, the replicas) goes with ``stop()``, and only those: each cluster has its own temp dir and
ports, several clusters (other tests, other engineers) can run side by side. It is ready when the
CLI says it serves and ``replicas`` engine replicas report to the control plane.

``config`` is a TOML text, or None for the DEFAULT configuration (``--replicas N`` only, what a
fresh clone runs). ``replicas=1`` is the plain single process (a benchmark's baseline).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from .net import free_port_below_ephemeral
from .serve import ServeProcess

START_TIMEOUT_S = 600.0  # Ray + four replicas on a loaded 2-core machine (measured: > 300 s with burners)
RAY_ENV = {"RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}


class ServeCluster(ServeProcess):
    def __init__(
        self,
        root: Path,
        model_dir: Path,
        config: str | None = None,
        *,
        replicas: int = 2,
        admin_key: str,
        env: dict[str, str] | None = None,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.root = Path(root)
        self.expected = replicas
        self.headers = {"Authorization": f"Bearer {admin_key}"}
        super().__init__(
            self.root / "data",
            model_dir,
            admin_key=admin_key,
            env={**RAY_ENV, **(env or {})},
            # Ray's own processes take ephemeral ports while Serve's proxy starts: one of them
            # could take a port picked there before the proxy binds it
            port=free_port_below_ephemeral(),
            config=config,
            args=("--replicas", str(replicas)),
            start_timeout=start_timeout,
            new_session=True,
        )

    def _wait_ready(self, timeout: float) -> None:
        try:
            super()._wait_ready(timeout)
        except BaseException:
            self.stop(timeout=20)  # the whole process group: no Ray left behind by a failed start
            raise

    def kill(self) -> None:
        """SIGKILL to the driver and every process of this run."""
        self.stop(timeout=0.1, sig=signal.SIGKILL)

    @property
    def db_path(self) -> Path:
        return self.data_dir / "loraplex.db"

    def is_ready(self) -> bool:
        if self.expected == 1:
            return super().is_ready()
        return "loraplex serving on" in self.output() and len(self.replicas()) >= self.expected

    def engine(self) -> dict:
        return httpx.get(self.url + "/admin/v1/engine", headers=self.headers, timeout=30).json()

    def replicas(self) -> list[dict]:
        """The engine replicas reporting to the control plane now ([] while it cannot say)."""
        try:
            return self.engine().get("replicas", [])
        except (httpx.HTTPError, ValueError):
            return []

    def wait_for_replicas(self, n: int, timeout: float, *, fresh_s: float = 10.0, steady_s: float = 15.0) -> list[dict]:
        """The n engine replicas once n report, each heard from within ``fresh_s``, and the same
        processes for ``steady_s`` on end. A replica a test froze or killed can be replaced by
        Serve some seconds after it reports again (its health checks timed out while it was
        stopped); the next test must start from two replicas that stay, not from that one."""
        deadline = time.time() + timeout
        since, pids = 0.0, frozenset()
        while True:
            reps = self.replicas()
            now = time.time()
            ok = len(reps) == n and all(now - r["seen"] < fresh_s for r in reps)
            current = frozenset(r["pid"] for r in reps)
            if not ok or current != pids:
                since, pids = now, current if ok else frozenset()
            elif now - since >= steady_s:
                return reps
            assert now < deadline, f"not {n} steady replicas within {timeout:.0f} s: {reps}"
            time.sleep(0.5)

    def control(self) -> dict:
        """The control-plane actor as the ingress last saw it (pid, epoch, live reservations)."""
        return self.engine().get("control", {})

    def stop(self, timeout: float = 120, sig: int = signal.SIGINT) -> None:
        """``sig`` to the driver (it drains and takes the deployments down), then SIGKILL to
        whatever is left of this run's process group (never another run's Ray)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
