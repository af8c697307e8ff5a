"""An HTTP server in a process of its own: started with its output in a log file, ready when a URL
answers (polled, a generous deadline; a process that exits is seen at once), killed or stopped.

The base of every server process the harness starts: ``serve.ServeProcess`` (``loraplex serve``),
``ray.ServeCluster``, ``s3.MotoServer``, ``prometheus.PrometheusProcess``; a benchmark starts a
peer's server (vLLM) with it directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from .wait import WaitTimeout, wait_for


def child_env(env: Mapping[str, str | None] | None = None, *, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) updated with ``env``; a None value removes
    the variable (so the child gets its default)."""
    out = dict(os.environ if base is None else base)
    for key, value in (env or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


class ServerProcess:
    """``argv`` serving HTTP on 127.0.0.1:``port``; ``ready_path`` answering ``ready_status`` (None:
    any answer) means it is up. ``new_session``: its own process group (``stop_group`` ends its
    children too). ``start=False``: call ``start()`` later (or again, after ``stop()``, on the
    same port)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        log: Path,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/health",
        ready_status: int | None = 200,
        # A loaded 2-core machine can take minutes to import torch (a clean clone at load ~17 took
        # over 180 s); a process that dies is seen at once, so a long ceiling costs nothing.
        start_timeout: float = 600,
        new_session: bool = False,
        start: bool = True,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = Path(log)
        self.env = dict(env) if env is not None else None
        self.ready_path, self.ready_status = ready_path, ready_status
        self.new_session = new_session
        self.start_timeout = start_timeout
        self.startup_s = 0.0  # from the process start to the first ready answer
        self.proc: subprocess.Popen[bytes] | None = None
        if start:
            self.start()

    @property
    def name(self) -> str:
        return Path(self.argv[0]).name

    def start(self) -> None:
        started = time.perf_counter()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=self.new_session
            )
        self._wait_ready(self.start_timeout)
        self.startup_s = time.perf_counter() - started

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def is_ready(self) -> bool:
        try:
            status = httpx.get(self.url + self.ready_path, timeout=2).status_code
        except httpx.HTTPError:
            return False
        return self.ready_status is None or status == self.ready_status

    def _exited(self) -> str | None:
        assert self.proc is not None
        code = self.proc.poll()
        return None if code is None else f"exited ({code}):\n{self.output()[-4000:]}"

    def _wait_ready(self, timeout: float) -> None:
        try:
            wait_for(
                self.is_ready,
                timeout=timeout,
                interval=0.2,
                what=f"{self.name} on {self.url}",
                give_up=self._exited,
                details=lambda: self.output()[-4000:],
            )
        except WaitTimeout:
            self.kill()  # never leave a half-started server holding the port
            raise

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no flush (what a crash looks like)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self, timeout: float = 30, sig: int = signal.SIGINT) -> None:
        """``sig`` (SIGINT: a clean shutdown), SIGKILL if it does not end within ``timeout``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def stop_group(self, timeout: float = 30, sig: int = signal.SIGTERM) -> None:
        """``sig`` to the whole process group (``new_session``), then SIGKILL to what is left of it
        (children that ignored ``sig``): never another run's processes."""
        assert self.new_session and self.proc is not None
        for s in (sig, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, s)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
