"""Where a suite run's time goes: a per-worker timeline of every test, on request.

``LORAPLEX_TEST_TIMELINE=/some/prefix scripts/test.sh`` makes each pytest process (each xdist worker,
or the one process without xdist) append one JSON line per test to ``<prefix>.<worker>.jsonl``: its
node id, its xdist group, wall-clock start and end, and the CPU seconds it used in the worker and in
the child processes the worker reaped meanwhile (servers it started). Wall time alone misleads on a
shared machine; CPU time says what a test costs whatever else runs beside it.

``python -m harness.timeline /some/prefix`` (from tests/) prints each worker's span, busy and idle
time, the groups that ran longest, and the tests that did.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

ENV = "LORAPLEX_TEST_TIMELINE"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Recorder:
    """A pytest plugin: one JSON line per test, flushed at once (a killed run keeps what it saw)."""

    def __init__(self, prefix: str, worker: str) -> None:
        self.worker = worker
        self.out = open(f"{prefix}.{worker}.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (lives for the session)

    def _write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def pytest_sessionstart(self) -> None:
        self._write({"event": "start", "worker": self.worker, "t": time.time()})

    def pytest_sessionfinish(self) -> None:
        self._write({"event": "finish", "worker": self.worker, "t": time.time()})
        self.out.close()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        from .xdist_groups import test_group

        start, cpu, children = time.time(), time.process_time(), _children_cpu()
        yield
        self._write(
            {
                "event": "test",
                "worker": self.worker,
                "nodeid": item.nodeid,
                "group": test_group(item.nodeid),
                "start": start,
                "end": time.time(),
                "cpu": round(time.process_time() - cpu, 3),
                "children_cpu": round(_children_cpu() - children, 3),
            }
        )


def register(config: pytest.Config) -> None:
    prefix = os.environ.get(ENV)
    if prefix:
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        config.pluginmanager.register(Recorder(prefix, worker), "loraplex-timeline")


def report(prefix: str, top: int = 25) -> str:
    records = []
    for path in sorted(Path(prefix).parent.glob(Path(prefix).name + ".*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tests = [r for r in records if r["event"] == "test"]
    if not tests:
        return "no tests recorded"
    # time 0: the first worker's session start (collection, imports and fixtures before the first test
    # show as `first`)
    t0 = min([r["t"] for r in records if r["event"] == "start"] + [r["start"] for r in tests])
    lines = ["worker  first   last    busy    idle-inside  tests  cpu(worker)  cpu(children)"]
    for worker in sorted({r["worker"] for r in tests}):
        mine = sorted((r for r in tests if r["worker"] == worker), key=lambda r: r["start"])
        first, last = mine[0]["start"] - t0, mine[-1]["end"] - t0
        busy = sum(r["end"] - r["start"] for r in mine)
        lines.append(
            f"{worker:7} {first:6.0f}s {last:6.0f}s {busy:6.0f}s {last - first - busy:8.0f}s  {len(mine):6d}"
            f"  {sum(r['cpu'] for r in mine):9.0f}s  {sum(r['children_cpu'] for r in mine):9.0f}s"
        )
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in tests:
        groups[(r["group"], r["worker"])].append(r)
    lines.append(f"\nlongest groups (wall from first start to last end; of {len(groups)})")
    spans = sorted(
        ((max(r["end"] for r in rs) - min(r["start"] for r in rs), g, w, rs) for (g, w), rs in groups.items()),
        reverse=True,
    )
    for span, group, worker, rs in spans[:top]:
        begin = min(r["start"] for r in rs) - t0
        cpu = sum(r["cpu"] + r["children_cpu"] for r in rs)
        lines.append(f"{span:7.1f}s  {worker:4} at {begin:6.0f}s  cpu {cpu:6.1f}s  {len(rs):4d} tests  {group}")
    lines.append("\nlongest tests")
    for r in sorted(tests, key=lambda r: r["start"] - r["end"])[:top]:
        lines.append(
            f"{r['end'] - r['start']:7.1f}s  cpu {r['cpu'] + r['children_cpu']:6.1f}s  {r['worker']:4} {r['nodeid']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25))
