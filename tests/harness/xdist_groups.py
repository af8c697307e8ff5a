"""Which tests share a pytest-xdist worker, and which groups start first.

``scripts/test.sh`` runs the suite on three xdist workers (two cores). A group of tests always runs on one worker,
in collection order, so that a module's module-scoped servers start once, only one Ray cluster
runs at a time, and one copy of the real demo model is in memory.

Why a scheduler of our own rather than ``--dist loadgroup`` with ``xdist_group`` marks: with
pytest 9.2 and pytest-xdist 3.8, loadgroup's worker-side renaming of node ids (``test@group``)
no longer takes effect (pytest-xdist issue #1386), so every group was silently spread over both
workers: both started every module server and both started Ray clusters. Here the grouping is a
pure function of the node id, computed where the work is scheduled.

Order matters: the longest groups go first (longest-processing-time first), so the Ray group and
the demo model start at once and the many short modules fill in around them instead of queuing
behind them at the end. Long groups that are mostly waiting (the crash soak's idle gaps, the lease
tests' restarts) count by their wall time too: costed by their one or six tests they were queued
last and ran alone at the end (quiet run, three workers: the soak's 92 s was the last 100 s).
"""

from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler import LoadScopeScheduling

RAY = "ray"
DEMO = "demo"
UI = "ui"

# Groups that run for minutes whatever their test count (process starts, clusters, the real model):
# measured whole-suite seconds on the shared 2-core machine, rounded. Everything else is costed by
# its number of tests, which is what xdist's own reordering uses.
HEAVY_SECONDS = {
    RAY: 1500,  # test_scale_out (~900) and test_scale_out_restart (~600: a rollout, a kill -9, two starts)
    DEMO: 400,
    "tests/platform/test_faults_processes.py": 150,
    "tests/platform/test_instances_processes.py": 150,
    "tests/platform/test_api_fuzz.py": 120,
    "tests/platform/test_cluster_leases.py": 180,  # ray.init and actor restarts: mostly waiting
    "tests/platform/test_crash_soak.py": 95,  # four idle gaps of 12 s on purpose
}


def test_group(nodeid: str) -> str:
    """The group of one test, from its node id alone."""
    nodeid = nodeid.split("@", 1)[0] if "@" in nodeid.rsplit("]", 1)[-1] else nodeid  # an xdist_group suffix
    if "replicas-2" in nodeid or nodeid.startswith("tests/platform/test_scale_out"):
        return RAY  # one Ray cluster at a time on a 2-core machine
    if nodeid.startswith("tests/demo/"):
        return DEMO
    if nodeid.startswith("tests/ui/"):
        # one UI server per worker; Chromium is per module (tests/ui/conftest.py): Playwright's sync
        # API marks an event loop running in the main thread while it lives, which every later
        # async test of that worker tripped over when the browser lived for the whole session
        return UI
    return nodeid.split("::", 1)[0]  # a module stays together: its module-scoped servers start once


def _cost(group: str, size: int) -> float:
    return HEAVY_SECONDS.get(group, float(size))


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with our groups as the scopes, the costliest queued first."""

    def _split_scope(self, nodeid: str) -> str:
        return test_group(nodeid)

    def schedule(self) -> None:
        if self.collection is None:  # the first call: build the queue in our order
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            units: OrderedDict[str, dict[str, bool]] = OrderedDict()
            for nodeid in self.collection:
                units.setdefault(test_group(nodeid), {})[nodeid] = False
            for group in sorted(units, key=lambda g: -_cost(g, len(units[g]))):
                self.workqueue[group] = units[group]
        # the collection is known: the parent hands each idle worker its next unit
        super().schedule()
