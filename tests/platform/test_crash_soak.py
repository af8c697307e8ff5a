"""The traffic that crashed ``loraplex serve`` under its default launch (issue 32), at CI size:
streaming chat clients, adapters loaded and unloaded through vLLM's ``/v1/load_lora_adapter`` and
the admin API, and idle gaps longer than anyio's worker threads live (they exited after running
torch, and with the old launch's Intel OpenMP ``dist`` barriers the second such exit was a SIGSEGV,
~45 s in). The server is started as users start it (fast runtime on: no LORAPLEX_* setting but the
tests' admin key and model); it must be alive at the end with no 5xx. The ``dist`` case sets those
barrier patterns by hand: there any torch work left on a short-lived thread kills the process, so
it checks that every route keeps torch on long-lived threads (``engine/torch_threads.py``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from harness.crash_soak import CrashSoak, SoakResult
from platform_helpers import ADMIN_KEY, make_peft_adapter

pytestmark = pytest.mark.slow

DIST = {
    k: "dist,dist"
    for k in ("KMP_FORKJOIN_BARRIER_PATTERN", "KMP_PLAIN_BARRIER_PATTERN", "KMP_REDUCTION_BARRIER_PATTERN")
}
LAUNCHES = {"default": {}, "dist": DIST}


def _soak(soak: CrashSoak, url: str) -> SoakResult:
    # Four rounds: the old launch died when the third round's first request pruned the workers
    # that had gone idle (worker threads exit at the next request after 10 s idle).
    result = soak.run(rounds=4)
    with httpx.Client(base_url=url, timeout=120) as c:  # one more request: prunes the idle workers again
        soak.stream(c, soak.base_model, 999)
    return result


def test_server_survives_streams_adapter_churn_and_idle_gaps(serve_process, demo_model_dir, tmp_path):
    """Both launches, each its own server, soaked at the same time. A soak is mostly idle gaps (four
    of 12 s: the point of it), so run one after the other they cost ~175 s of a test worker, side by
    side ~90 s. Each server still gets exactly its own soak: its gaps have no request to it, its
    rounds and its final pruning request are the same as alone. The two starts overlap as well."""
    adapters = {}
    for launch in LAUNCHES:
        # Under the data dir's adapter-files folder: the only file:// root a default launch allows, so
        # vLLM's /v1/load_lora_adapter really loads it (outside it every load was a 400 and the soak
        # never ran the load path that crashed).
        data = tmp_path / launch / "data"
        adapters[launch] = make_peft_adapter(demo_model_dir, data / "adapter-files" / "adapter", r=4)
    with ThreadPoolExecutor(len(LAUNCHES)) as pool:  # the two starts overlap too
        starting = {
            launch: pool.submit(serve_process, tmp_path / launch / "data", demo_model_dir, env=env, clean_env=True)
            for launch, env in LAUNCHES.items()
        }
        servers = {launch: future.result() for launch, future in starting.items()}
    soaks = {
        launch: CrashSoak(
            server.url,
            ADMIN_KEY,
            adapters[launch],
            lambda proc=server.proc: proc.poll() is None,
            mixed=launch == "dist",
        )
        for launch, server in servers.items()
    }
    with ThreadPoolExecutor(len(soaks)) as pool:
        running = {launch: pool.submit(_soak, soak, servers[launch].url) for launch, soak in soaks.items()}
        results = {launch: future.result() for launch, future in running.items()}
    for launch, result in results.items():
        server = servers[launch]
        assert server.proc.poll() is None, (launch, result.summary(), server.output()[-4000:])
        assert result.server_errors == 0, (launch, result.summary())
        assert not result.errors, (launch, result.summary())
        assert result.statuses["vllm.load 200"] >= 4 and result.statuses["admin.upload 201"] >= 4, (
            launch,
            result.summary(),
        )
        assert result.streams_ok >= 8, (launch, result.summary())
