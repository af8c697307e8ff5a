"""Degraded, not dead, at start (real `loraplex serve` processes): PostgreSQL unreachable at start
→ the server starts, /ready is 503 and routes answer 503 + Retry-After, then it migrates and serves
once the database is back; a file that is not a database → one line naming it, exit code 2."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest
from billing_helpers import H
from harness.serve import serve_argv
from harness.wait import wait_for


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_down_at_start_then_back(tmp_path, demo_model_dir, private_postgres, serve_process):
    pg = private_postgres
    pg.stop("fast")
    server = serve_process(tmp_path / "data", demo_model_dir, env={"LORAPLEX_DATABASE_URL": pg.url})
    ready = httpx.get(server.url + "/ready", timeout=30)
    assert ready.status_code == 503 and ready.headers["retry-after"]
    r = httpx.get(server.url + "/admin/v1/tenants", headers=H, timeout=30)
    assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "database_unavailable"
    pg.start()
    wait_for(
        lambda: httpx.get(server.url + "/ready", timeout=30).status_code == 200,
        timeout=300,
        interval=0.5,
        what="/ready after PostgreSQL came back",
        details=lambda: server.output()[-3000:],
    )
    r = httpx.post(server.url + "/admin/v1/tenants", json={"name": "after"}, headers=H, timeout=30)
    assert r.status_code == 201, r.text  # migrated: the schema is there
    assert "Traceback" not in server.output()


@pytest.mark.slow
def test_a_file_that_is_not_a_database_is_one_line_and_exit_2(tmp_path, demo_model_dir):
    data = tmp_path / "data"
    data.mkdir()
    bad = data / "not-a-db.sqlite"
    bad.write_bytes(b"this is not a database file at all, " * 200)
    env = {
        **os.environ,
        "LORAPLEX_ENGINE__MODEL": str(demo_model_dir),
        "LORAPLEX_DATABASE_URL": f"sqlite:///{bad}",
    }
    proc = subprocess.run(
        serve_argv(data, 0),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(bad) in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "var,value", [("LORAPLEX_BF16_LINEAR", "mkl"), ("LORAPLEX_CPU_KIND", "sapphire")], ids=["linear", "kind"]
)
def test_an_unknown_cpu_override_is_one_line_and_exit_2(tmp_path, demo_model_dir, var, value):
    """The CPU kernels' environment overrides are checked when the engine's configuration is built:
    a typo names the variable and its choices in one line (no traceback) and nothing is served."""
    data = tmp_path / "data"
    data.mkdir()
    env = {**os.environ, "LORAPLEX_ENGINE__MODEL": str(demo_model_dir), var: value}
    proc = subprocess.run(serve_argv(data, 0), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and var in errors[0] and repr(value) in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
