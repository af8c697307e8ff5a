"""Torch work off the engine thread runs on a fixed set of long-lived threads (``torch_threads``),
whatever thread asks for it (issue 32: adapter loads on anyio's short-lived worker threads crashed
``loraplex serve`` under Intel OpenMP's ``dist`` barriers).

The process test uses that libiomp bug as its oracle: under ``dist`` barriers, two short-lived
threads that each ran one torch op kill the process when the second exits (checked first, as a
control: if a future libiomp no longer crashes, the test skips instead of passing blindly). Then
the engine's own entry points (``AsyncEngine.add_adapter``, ``validate_adapter_dir``), called
from short-lived threads the way a server calls them, must leave the process alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from lora_testlib import make_peft_adapter

from loraplex.engine import runtime_env, torch_threads

DIST = {
    k: "dist,dist"
    for k in ("KMP_FORKJOIN_BARRIER_PATTERN", "KMP_PLAIN_BARRIER_PATTERN", "KMP_REDUCTION_BARRIER_PATTERN")
}


def test_callers_on_short_lived_threads_share_a_few_long_lived_ones():
    seen: list[tuple[int, str]] = []

    def ask() -> None:
        seen.append(torch_threads.run(lambda: (threading.get_ident(), threading.current_thread().name)))

    callers = [threading.Thread(target=ask) for _ in range(12)]
    for t in callers:  # one after the other: each caller thread has exited before the next starts
        t.start()
        t.join()
    idents = {ident for ident, _ in seen}
    assert len(seen) == 12
    assert 1 <= len(idents) <= torch_threads.WORKERS
    assert idents.isdisjoint({t.ident for t in callers})
    assert all(name.startswith(torch_threads.THREAD_PREFIX) for _, name in seen)
    assert all(t.is_alive() for t in threading.enumerate() if t.ident in idents)  # still there, waiting


def test_errors_come_back_and_long_lived_threads_run_inline():
    def boom() -> None:
        raise KeyError("no such adapter")

    out: list[BaseException] = []

    def caller() -> None:
        try:
            torch_threads.run(boom)
        except KeyError as exc:
            out.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    t.join()
    assert len(out) == 1 and out[0].args == ("no such adapter",)
    # the main thread and a thread marked long-lived (the engine thread) are not redirected
    assert torch_threads.run(threading.get_ident) == threading.get_ident()
    marked: list[bool] = []

    def engine_like() -> None:
        torch_threads.mark_long_lived()
        marked.append(torch_threads.run(threading.get_ident) == threading.get_ident())

    t = threading.Thread(target=engine_like)
    t.start()
    t.join()
    assert marked == [True]


CONTROL = textwrap.dedent(
    """
    import threading, torch
    x = torch.randn(256, 256)
    for _ in range(3):
        t = threading.Thread(target=lambda: (x.to(torch.bfloat16).float() @ x).sum())
        t.start(); t.join()
    print("alive")
    """
)

ENGINE = textwrap.dedent(
    """
    import sys, threading
    from loraplex.engine import AsyncEngine, EngineConfig, validate_adapter_dir
    model, adapter = sys.argv[1], sys.argv[2]
    engine = AsyncEngine(EngineConfig(model=model, dtype="bfloat16", kernel_backend="torch", max_loras=2,
                                      max_lora_rank=16, max_num_seqs=2, kv_cache_memory_gb=0.01)).start()
    def serve_like(i):  # what a sync route does on an anyio worker thread
        validate_adapter_dir(adapter, model, 16)
        engine.add_adapter(f"a{i}", adapter)
        engine.remove_adapter(f"a{i}")
    for i in range(4):
        t = threading.Thread(target=serve_like, args=(i,))
        t.start(); t.join()
    engine.shutdown()
    print("alive")
    """
)


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LORAPLEX_", "KMP_", "OMP_WAIT", "LD_PRELOAD"))}
    env = {**base, "LORAPLEX_FAST_RUNTIME": "0", "LD_PRELOAD": str(runtime_env.find_iomp5()), **DIST}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two real processes
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux")
@pytest.mark.skipif(runtime_env.find_iomp5() is None, reason="intel-openmp is a dependency; missing here")
def test_adapter_loads_from_short_lived_threads_survive_dist_barriers(model_factory, tmp_path: Path):
    control = _run(CONTROL)
    if control.returncode != -signal.SIGSEGV:
        pytest.skip(f"this libiomp survives short-lived torch threads under dist barriers (rc {control.returncode})")
    model = model_factory("llama_gqa")
    adapter = make_peft_adapter(model, tmp_path / "a", r=4, target_modules=["q_proj", "v_proj"])
    proc = _run(ENGINE, model, adapter)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("alive"), (proc.returncode, proc.stderr[-3000:])
