"""PostgreSQL for tests, benchmarks and ``scripts/test.sh``: written once.

``PostgresServer``: a private server (initdb in a temp dir, loopback, a free port, trust auth) that a test
may stop and start under load without disturbing anyone else. ``create_database`` /
``drop_database``: a throw-away database on a shared server, one per test.

    PYTHONPATH=tests python -m harness.postgres start --port 55432   # prints DIR and URL lines
    PYTHONPATH=tests python -m harness.postgres stop DIR
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from .net import free_port


def server_binaries() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


def unavailable_reason() -> str | None:
    """Why a private server cannot run here (None: it can). PostgreSQL refuses to run as root, so
    the server runs as the ``postgres`` user through runuser."""
    if server_binaries() is None:
        return "needs the PostgreSQL server binaries (apt-get install postgresql)"
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        return "needs root and runuser (the server runs as the postgres user)"
    return None


# A throw-away server: no fsync, no full-page images. What these give up is only a committed
# transaction surviving an operating-system crash or power loss, which no test can cause or checks.
# Every commit is still written to the kernel before it returns (synchronous_commit stays on), so a
# killed or immediately stopped server (the fault tests) loses nothing it acknowledged. Without them
# each test's CREATE DATABASE ... TEMPLATE plus DROP DATABASE took ~470 ms of fsync waits on this
# machine's disk instead of ~170 ms, in every test that runs on PostgreSQL.
DURABILITY = "-c fsync=off -c full_page_writes=off"


class PostgresServer:
    """A PostgreSQL server of our own, with one database (``database``) ready at ``url``."""

    def __init__(self, port: int | None = None, database: str = "loraplex", directory: Path | None = None) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.bin = server_binaries()
        assert self.bin is not None
        self.dir = directory or Path(tempfile.mkdtemp(prefix="lpx-pg-"))
        self.database = database
        shutil.chown(self.dir, "postgres")
        self.port = port or free_port()
        # --no-sync: see DURABILITY (initdb otherwise fsyncs every file it wrote, seconds on a busy disk)
        self._pg("initdb", "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        subprocess.run(
            [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-qc"]
            + [f'create database "{database}"'],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _pg(self, tool: str, *args: str) -> None:
        assert self.bin is not None
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bin / tool), *args],
            check=True,
            capture_output=True,
            timeout=600,  # initdb on a loaded 2-core machine can take minutes
        )

    def start(self) -> None:
        opts = f"-k {self.dir} -p {self.port} -c listen_addresses=127.0.0.1 {DURABILITY}"
        self._pg("pg_ctl", "-D", str(self.dir / "data"), "-l", str(self.dir / "log"), "-w", "-o", opts, "start")

    def stop(self, mode: str = "immediate") -> None:
        self._pg("pg_ctl", "-D", str(self.dir / "data"), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        destroy(self.dir)


PgServer = PostgresServer  # the name before the harness was one (kept for older tests)


def destroy(directory: Path) -> None:
    """Stop the server living in ``directory`` (if it runs) and delete it."""
    binaries = server_binaries()
    if binaries is not None and (directory / "data").exists():
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(binaries / "pg_ctl"), "-D", str(directory / "data")]
            + ["-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
    shutil.rmtree(directory, ignore_errors=True)


# ------------------------------------------------------------------ databases on a shared server
def create_database(admin_url: str, template: str | None = None) -> str:
    """A new, uniquely named database on the server of ``admin_url``; returns its URL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"lpx_{uuid.uuid4().hex[:12]}"
    eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
    finally:
        eng.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, url: str) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    eng = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    finally:
        eng.dispose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("start", help="start a private server; prints DIR=... and URL=...")
    up.add_argument("--port", type=int, default=None)
    up.add_argument("--database", default="loraplex_test")
    down = sub.add_parser("stop", help="stop the server in DIR and delete DIR")
    down.add_argument("dir", type=Path)
    args = ap.parse_args()
    if args.cmd == "start":
        server = PostgresServer(port=args.port, database=args.database)
        print(f"DIR={server.dir}\nURL={server.url}")
    else:
        destroy(args.dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
