"""Each engine replica's own adapter cache folder: ``<parent>/<replica name>/``.

A ``DiskCache`` assumes it is the only process in its folder (its index is in memory, its start
sweeps the staging area, its evictions delete entries): shared by the ingress and the replicas, one
process's eviction would delete a folder another's engine reads, and a replica starting would sweep
another's download in progress. So every replica fetches into a folder of its own: one download
per replica, which is also what two replicas on two nodes do.

A replica holds an exclusive ``flock`` on ``<folder>/.owner`` for its life; a replica starting
removes the folders whose lock it can take (their owner is gone: killed, replaced by Serve), so
the folders of dead replicas do not pile up. The kernel drops the lock when a process dies, however
it dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("loraplex.platform.cluster")

OWNER_FILE = ".owner"


class ReplicaCacheDir:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def claim(cls, parent: Path, name: str) -> ReplicaCacheDir:
        """Create and lock ``parent/name`` (after removing the folders of replicas that are gone)."""
        path = parent / name
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / OWNER_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a name is unique: never held by another
        remove_abandoned(parent)  # after our own lock: a starting replica never takes ours
        return cls(path, fd)

    def release(self) -> None:
        """Remove the folder (its owner is stopping)."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)
        self._fd = None


def remove_abandoned(parent: Path) -> list[str]:
    """Remove every folder under ``parent`` whose owner no longer holds its lock."""
    removed = []
    for folder in parent.iterdir():
        owner = folder / OWNER_FILE
        if not folder.is_dir() or not owner.is_file():
            continue
        try:
            fd = os.open(owner, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its replica is alive
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
        finally:
            os.close(fd)
    if removed:
        log.info("removed the adapter caches of %d replica(s) that are gone: %s", len(removed), ", ".join(removed))
    return removed
