"""serve_bench.py --step-log: put this folder on a loraplex server's PYTHONPATH (with LORAPLEX_STEPLOG
set to a file) and every engine step appends one line: wall start, wall ms, engine-thread CPU ms,
decode rows, prompt tokens. The benchmark reads it to count the steps that carried prompt tokens
beside decodes and the inter-token gaps those steps stretched: the shape of a step under real HTTP
arrivals, which ITL percentiles alone do not show. Benchmark tooling only; the engine never reads it.

The engine module is patched when it is first imported (an import hook), so a process that
re-executes itself under the fast runtime pays nothing before the restart.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time

PATH = os.environ.get("LORAPLEX_STEPLOG")
TARGET = "loraplex.engine.llm_engine"


def _patch(llm_engine) -> None:
    from loraplex.engine import scheduler

    out = open(PATH, "a", buffering=1)  # noqa: SIM115 (lives as long as the server)
    shape = [0, 0]
    schedule, step = scheduler.Scheduler.schedule, llm_engine.LLMEngine.step

    def logged_schedule(self):
        plan = schedule(self)
        shape[0] = sum(1 for c in plan.chunks if c.seq.in_decode)
        shape[1] = sum(c.num_tokens for c in plan.chunks if not c.seq.in_decode)
        return plan

    def logged_step(self):
        shape[0] = shape[1] = 0
        w0, c0 = time.perf_counter(), time.thread_time()
        result = step(self)
        w1, c1 = time.perf_counter(), time.thread_time()
        out.write(f"{w0:.4f} {1000 * (w1 - w0):.1f} {1000 * (c1 - c0):.1f} {shape[0]} {shape[1]}\n")
        return result

    scheduler.Scheduler.schedule = logged_schedule
    llm_engine.LLMEngine.step = logged_step


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


if PATH:
    sys.meta_path.insert(0, _Hook())
