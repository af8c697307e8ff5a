"""``loraplex serve`` applies the fast CPU runtime by itself: the served process (same pid after its
one restart) has tcmalloc and Intel OpenMP mapped (/proc/PID/maps), the resolved configuration says
so, and with a library missing it falls back cleanly and still answers through the OpenAI client."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from billing_helpers import new_tenant
from harness.serve import ServeProcess
from openai import OpenAI

from loraplex.engine import runtime_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux"),
]
needs_both = pytest.mark.skipif(
    not (runtime_env.find_tcmalloc() and runtime_env.find_iomp5()),
    reason="tcmalloc (libtcmalloc-minimal4) and intel-openmp are installed by the set-up; missing here",
)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _complete(server: ServeProcess) -> str:
    _tid, key = new_tenant(server.url, "runtime")
    client = OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    out = client.completions.create(model=model, prompt="Hello", max_tokens=4, temperature=0)
    assert out.usage is not None and out.usage.completion_tokens == 4
    return out.choices[0].text


def _clean_env(monkeypatch) -> None:
    """Children of this test process must not inherit a preload or a switch from its environment."""
    for k in list(os.environ):
        if k.startswith(("KMP_", "LORAPLEX_TCMALLOC", "LORAPLEX_IOMP5", "LORAPLEX_FAST_RUNTIME", "LORAPLEX_RUNTIME")):
            monkeypatch.delenv(k)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)


@needs_both
def test_served_process_has_the_preload(tmp_path, demo_model_dir, monkeypatch, serve_process):
    _clean_env(monkeypatch)
    server = serve_process(tmp_path / "data", demo_model_dir, start_timeout=600)
    try:
        assert runtime_env.active(server.proc.pid) == {"tcmalloc": True, "iomp5": True}
        env = _environ(server.proc.pid)
        assert env["KMP_BLOCKTIME"] == "1" and "libiomp5" in env["LD_PRELOAD"]
        assert _complete(server)
        out = server.output()
        assert out.count("restarting under") == 1  # one restart, then it serves
        runtime_line = next(line for line in out.splitlines() if line.strip().startswith("runtime "))
        assert "tcmalloc + Intel OpenMP" in runtime_line
    finally:
        server.kill()


@needs_both
def test_missing_library_falls_back_cleanly(tmp_path, demo_model_dir, monkeypatch, serve_process):
    _clean_env(monkeypatch)
    server = serve_process(tmp_path / "data", demo_model_dir, env={"LORAPLEX_IOMP5": ""}, start_timeout=600)
    try:
        assert runtime_env.active(server.proc.pid) == {"tcmalloc": True, "iomp5": False}
        assert _environ(server.proc.pid).get("OMP_WAIT_POLICY") == "PASSIVE"
        assert _complete(server)
        assert "libiomp5.so not found: pip install intel-openmp" in server.output()
    finally:
        server.kill()


def test_switched_off_runs_as_started(tmp_path, demo_model_dir, monkeypatch, serve_process):
    _clean_env(monkeypatch)
    server = serve_process(tmp_path / "data", demo_model_dir, env={"LORAPLEX_FAST_RUNTIME": "0"}, start_timeout=600)
    try:
        assert runtime_env.active(server.proc.pid) == {"tcmalloc": False, "iomp5": False}
        assert "LD_PRELOAD" not in _environ(server.proc.pid)
        assert _complete(server)
        assert "restarting" not in server.output()
    finally:
        server.kill()
