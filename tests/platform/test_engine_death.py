"""A server whose engine dies ends its process with a non-zero status (70), after answering 503 on
/ready and /health, so that a supervisor restarts it (issue 32: the process used to stay up or die
with nobody restarting it). The fault is real: the engine loop raises between two steps through the
same ``except`` a bug in a step takes (``AsyncEngine.inject_fault``, reached through the debug route
that only ``server.fault_injection`` enables); the process is a real ``loraplex serve``."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from billing_helpers import new_tenant, stream
from platform_helpers import admin_headers

from loraplex.platform.health import ENGINE_DEAD_EXIT_CODE

H = admin_headers()


def test_debug_route_is_off_by_default_and_admin_only(client):
    assert client.post("/admin/v1/debug/engine-fault", headers=H).status_code == 404
    assert client.post("/admin/v1/debug/engine-fault").status_code == 401
    assert client.get("/ready").status_code == 200  # the shared engine is untouched
    assert "/admin/v1/debug/engine-fault" not in client.get("/openapi.json").json()["paths"]


@pytest.mark.slow
def test_engine_death_answers_503_then_exits_non_zero(serve_process, demo_model_dir, tmp_path):
    env = {"LORAPLEX_SERVER__FAULT_INJECTION": "true", "LORAPLEX_SERVER__ENGINE_DEATH_GRACE_S": "20"}
    server = serve_process(tmp_path / "data", demo_model_dir, env=env)
    _, key = new_tenant(server.url, "acme")
    model = httpx.get(server.url + "/v1/models", headers=admin_headers(key), timeout=30).json()["data"][0]["id"]
    assert httpx.get(server.url + "/ready", timeout=30).status_code == 200

    # A stream in flight when the engine dies: it ends with an error event, it does not hang.
    got_tokens = threading.Event()
    results: list = []
    reader = threading.Thread(
        target=lambda: results.append(
            stream(
                server.url,
                key,
                model,
                max_tokens=1000,
                ignore_eos=True,
                timeout=300,
                on_chunk=lambda _r: got_tokens.set(),
            )
        ),
        daemon=True,
    )
    reader.start()
    assert got_tokens.wait(300), "the stream never produced a token"

    r = httpx.post(server.url + "/admin/v1/debug/engine-fault", headers=H, timeout=30)
    assert r.status_code == 200, r.text
    reader.join(300)
    assert results, "the stream did not end after the engine died"
    assert results[0].error is not None and results[0].finish_reason is None, results[0]

    # Readiness and liveness say so while the process winds down (the grace is 20 s here).
    ready = httpx.get(server.url + "/ready", timeout=30)
    assert ready.status_code == 503 and ready.json()["engine"] == "dead", ready.text
    assert httpx.get(server.url + "/health", timeout=30).status_code == 503
    completion = httpx.post(
        server.url + "/v1/completions",
        json={"model": model, "prompt": "x", "max_tokens": 2},
        headers=admin_headers(key),
        timeout=30,
    )
    assert completion.status_code == 503 and "error" in completion.json()

    # Then the process exits by itself, with the engine-death status.
    deadline = time.monotonic() + 300
    while server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.proc.returncode == ENGINE_DEAD_EXIT_CODE, (server.proc.returncode, server.output()[-3000:])
    assert "engine died" in server.output()
