"""``loraplex serve`` in a process of its own, for tests and benchmarks: written once.

``ServeProcess`` starts the CLI on a free loopback port with its own data dir and log, waits (a
generous deadline, polling) until ``/health`` answers, and can be killed (SIGKILL: what a crash
looks like) or stopped (SIGINT: a clean shutdown). ``harness.ray.ServeCluster`` is the same
process with ``--replicas N`` on a local Ray of its own. ``serve_argv`` is its command line, for a
test that runs the CLI to see it refuse to start.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .net import free_port
from .process import ServerProcess, child_env

SMALL_KV = "[engine]\nkv_cache_memory_gb = 0.1\n"  # several servers share the machine


def serve_argv(
    data_dir: Path, port: int, *args: str, python: str = sys.executable, launcher: list[str] | None = None
) -> list[str]:
    """The ``loraplex serve`` command line: the CLI module under ``python`` (any venv's interpreter),
    or ``launcher`` (e.g. a venv's ``loraplex`` console script, as a user starts it)."""
    cli = launcher or [python, "-m", "loraplex.platform.cli"]
    return [*cli, "serve", "--data-dir", str(data_dir), "--port", str(port), *args]


class ServeProcess(ServerProcess):
    def __init__(
        self,
        data_dir: Path,
        model_dir: Path | None,
        *,
        admin_key: str | None = None,
        env: dict[str, str | None] | None = None,  # None: remove that variable (its default applies)
        port: int | None = None,
        config: str | None = SMALL_KV,
        args: tuple[str, ...] = (),
        start_timeout: float = 600,
        new_session: bool = False,
        python: str = sys.executable,  # a benchmark may serve another checkout's venv
        clean_env: bool = False,  # drop inherited LORAPLEX_* settings (LORAPLEX_TEST_* stay): defaults only
        log: Path | None = None,
        launcher: list[str] | None = None,  # instead of ``python -m loraplex.platform.cli``
    ) -> None:
        self.data_dir = Path(data_dir)
        port = port or free_port()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not clean_env or not k.startswith("LORAPLEX_") or k.startswith("LORAPLEX_TEST")
        }
        settings: dict[str, str | None] = {"PYTHONUNBUFFERED": "1", **(env or {})}
        if model_dir is not None:
            settings["LORAPLEX_ENGINE__MODEL"] = str(model_dir)
        if admin_key is not None:
            settings["LORAPLEX_ADMIN_KEY"] = admin_key
        extra: list[str] = []
        if config is not None:
            config_file = self.data_dir.parent / f"serve-{port}.toml"
            config_file.write_text(config)
            extra = ["--config", str(config_file)]
        super().__init__(
            serve_argv(self.data_dir, port, *extra, *args, python=python, launcher=launcher),
            port=port,
            log=log or self.data_dir.parent / f"serve-{port}-{time.time_ns()}.log",
            env=child_env(settings, base=inherited),
            start_timeout=start_timeout,
            new_session=new_session,
        )

    @property
    def name(self) -> str:
        return "loraplex serve"
