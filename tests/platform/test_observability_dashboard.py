"""The Grafana dashboard and the recording rules against a REAL Prometheus (Debian's binary, started
here) that scraped a real ``loraplex serve`` under a short load: every panel query and every
recording rule must return series. A misspelt metric, a missing ``_total`` or a label the code
does not export gives an empty result and fails here (promtool's unit tests cannot see that: they
run on series the test itself invents)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest
import yaml
from harness.prometheus import PrometheusProcess, prometheus_binary
from platform_helpers import admin_headers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
OBS = ROOT / "deploy" / "observability"
DASHBOARD = OBS / "grafana" / "loraplex-dashboard.json"
RULES = OBS / "prometheus" / "loraplex-rules.yml"
JOB = "loraplex"
# What Grafana substitutes: the dashboard's variables, as a dashboard showing this job would.
VARIABLES = {"$__rate_interval": "5m", "$job": JOB, "${datasource}": "prometheus"}


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, rows' nested panels included."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for target in p.get("targets", []):
                out.append((p["title"], target["expr"]))
    return out


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown dashboard variable in {expr}"
    return expr


def recording_rules() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["record"] for g in groups for r in g["rules"] if "record" in r]


@pytest.fixture
def prometheus_available() -> None:
    if prometheus_binary() is None:
        if os.environ.get("LORAPLEX_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("LORAPLEX_REQUIRE_PROMETHEUS=1 but prometheus is not installed")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")


def test_dashboard_shape_and_provisioning() -> None:
    dash = json.loads(DASHBOARD.read_text())
    queries = panel_queries(dash)
    assert len(queries) >= 20
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in dash["templating"]["list"]}
    for _title, expr in queries:
        used = set(re.findall(r"\$\{?(\w+)\}?", expr)) - {"__rate_interval"}
        assert used <= names, f"{expr} uses undefined variables {used - names}"
    prov = yaml.safe_load((OBS / "grafana" / "provisioning" / "dashboards.yml").read_text())
    assert prov["apiVersion"] == 1 and prov["providers"][0]["type"] == "file"


def _load(base_url: str) -> tuple[str, int]:
    """A short load: chat completions (plain and streamed) for one tenant, and a second tenant
    with rpm = 1 sending three requests, so its quota refuses some. Returns that tenant's id and
    the requests that ended (the oracle for the requests counter)."""
    from openai import OpenAI, RateLimitError

    ended = 0
    with httpx.Client(base_url=base_url, headers=admin_headers(), timeout=60) as admin:
        keys = {}
        for name in ("steady", "limited"):
            tid = admin.post("/admin/v1/tenants", json={"name": name}).json()["id"]
            keys[name] = (tid, admin.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"])
        r = admin.put(f"/admin/v1/tenants/{keys['limited'][0]}/quota", json={"rpm": 1})
        assert r.status_code == 200, r.text
    messages = [{"role": "user", "content": "Say something."}]
    steady = OpenAI(base_url=base_url + "/v1", api_key=keys["steady"][1], max_retries=0, timeout=120)
    model = steady.models.list().data[0].id
    for i in range(6):
        if i % 2:
            stream = steady.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True)
            assert sum(1 for _ in stream) > 0
        else:
            out = steady.chat.completions.create(model=model, messages=messages, max_tokens=8)
            assert out.usage.completion_tokens > 0
        ended += 1
    limited = OpenAI(base_url=base_url + "/v1", api_key=keys["limited"][1], max_retries=0, timeout=120)
    refused = 0
    for _ in range(3):
        try:
            limited.chat.completions.create(model=model, messages=messages, max_tokens=4)
            ended += 1
        except RateLimitError:
            refused += 1
    assert refused >= 2, "rpm = 1 must refuse the second and third request of the minute"
    return keys["limited"][0], ended


def test_every_panel_and_recording_rule_returns_series(
    prometheus_available, serve_process, demo_model_dir, tmp_path
) -> None:
    server = serve_process(tmp_path / "data", demo_model_dir)
    prom = PrometheusProcess(tmp_path / "prom", {JOB: server.url.removeprefix("http://")}, rule_files=(RULES,))
    try:
        assert prom.wait_for(f'up{{job="{JOB}"}} == 1'), prom.output()[-2000:]
        limited_tenant, ended = _load(server.url)
        # The load is over once Prometheus saw all of it (and the refusals), two scrapes apart.
        seen = prom.wait_for(f'sum(loraplex:requests_total{{job="{JOB}"}}) >= {ended}')
        assert seen, f"Prometheus never saw {ended} requests:\n{prom.query('loraplex:requests_total')}"
        assert prom.wait_for(f'count_over_time(loraplex:quota_refusals_total{{job="{JOB}"}}[5m]) >= 2')

        empty = []
        for title, expr in panel_queries(json.loads(DASHBOARD.read_text())):
            if not prom.wait_for(substitute(expr), timeout=30):
                empty.append(f"{title}: {substitute(expr)}")
        for record in recording_rules():
            if not prom.wait_for(f'{record}{{job="{JOB}"}}', timeout=60):
                empty.append(f"recording rule {record}")
        assert not empty, "no series for:\n" + "\n".join(empty)

        # Independent oracles for what the series say: the refused tenant by its admin-API id,
        # the requests by status, the engine alive, the restart count 0.
        refusals = prom.query(f'sum by (tenant, reason) (loraplex:quota_refusals_total{{job="{JOB}"}})')
        assert {(s["metric"]["tenant"], s["metric"]["reason"]) for s in refusals} == {(limited_tenant, "rpm")}
        ok = prom.query(f'sum(loraplex:requests_total{{job="{JOB}", status="ok"}})')
        assert float(ok[0]["value"][1]) == ended
        assert float(prom.query("min(loraplex:engine_alive)")[0]["value"][1]) == 1
        assert float(prom.query(f'max(changes(process_start_time_seconds{{job="{JOB}"}}[1h]))')[0]["value"][1]) == 0
    finally:
        prom.stop()
