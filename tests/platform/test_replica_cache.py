"""Each engine replica's adapter cache folder (``cluster/replica_cache.py``), with real processes:
a folder whose owner process is alive is never touched by another replica's start; the folder of a
replica that was killed (SIGKILL: no clean-up ran) is removed by the next start."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from loraplex.platform.cluster.replica_cache import OWNER_FILE, ReplicaCacheDir

pytestmark = pytest.mark.slow  # starts processes

WAIT_S = 60  # bounds a wait on a loaded box; nothing here measures time

OWNER = """
import sys, time
from pathlib import Path
from loraplex.platform.cluster.replica_cache import ReplicaCacheDir
d = ReplicaCacheDir.claim(Path(sys.argv[1]), sys.argv[2])
(d.path / ("a" * 64)).mkdir()  # a cached adapter
print("claimed", flush=True)
time.sleep(600)
"""


def _owner(parent, name) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(parent), name], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "claimed"
    return proc


def test_a_live_replicas_folder_is_kept_and_a_killed_ones_is_removed(tmp_path):
    parent = tmp_path / "replicas"
    alive, killed = _owner(parent, "engine-alive"), _owner(parent, "engine-killed")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(WAIT_S)
        assert (parent / "engine-killed" / OWNER_FILE).is_file()  # nothing cleaned up on a kill
        mine = ReplicaCacheDir.claim(parent, "engine-new")
        assert sorted(p.name for p in parent.iterdir()) == ["engine-alive", "engine-new"]
        assert (parent / "engine-alive" / ("a" * 64)).is_dir()  # its cached adapter untouched
        # a second replica starting meanwhile leaves this one's folder alone too
        other = ReplicaCacheDir.claim(parent, "engine-other")
        assert mine.path.is_dir()
        other.release()
        mine.release()
        assert sorted(p.name for p in parent.iterdir()) == ["engine-alive"]
    finally:
        alive.kill()
        alive.wait(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while (parent / "engine-alive").exists():  # its owner is gone now: the next start removes it
        ReplicaCacheDir.claim(parent, f"engine-{time.monotonic_ns()}").release()
        assert time.monotonic() < deadline
