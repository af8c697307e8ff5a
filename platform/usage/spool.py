"""The ledger's local safety net: an append-only file of usage records, fsync'd before a write
counts as durable, for when the database cannot take them. Replay is idempotent (records are
upserted by request id), so a crash during replay only means replaying again."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ACTIVE = "usage.spool.jsonl"
REJECTED = "usage.rejected.jsonl"  # rows the database refused on their own (kept for an operator)


class Spool:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def active(self) -> Path:
        return self.folder / ACTIVE

    def append(self, rows: list[dict], *, file: str = ACTIVE) -> None:
        if not rows:
            return
        data = "".join(json.dumps(r, default=str, separators=(",", ":")) + "\n" for r in rows).encode()
        fd = os.open(self.folder / file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if file == ACTIVE and not getattr(self, "_dir_synced", False):
            _fsync_dir(self.folder)  # the file's directory entry must survive a crash too
            self._dir_synced = True

    def pending_files(self) -> list[Path]:
        """Batches taken for replay (oldest first), then the active file."""
        taken = sorted(self.folder.glob("usage.replaying-*.jsonl"))
        return taken + ([self.active] if self.active.exists() and self.active.stat().st_size else [])

    def has_pending(self) -> bool:
        return bool(self.pending_files())

    def take(self) -> list[Path]:
        """Move the active file aside so new appends start a fresh one; return every file to replay."""
        if self.active.exists() and self.active.stat().st_size:
            os.rename(self.active, self.folder / f"usage.replaying-{time.time_ns()}.jsonl")
            _fsync_dir(self.folder)
            self._dir_synced = False
        return sorted(self.folder.glob("usage.replaying-*.jsonl"))

    @staticmethod
    def read(path: Path) -> list[dict]:
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line from a crash mid-append: not acknowledged
                continue
        return rows

    @staticmethod
    def done(path: Path) -> None:
        path.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
