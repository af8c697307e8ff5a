"""The Prometheus rules as code: `promtool check rules` (syntax, PromQL) and `promtool test rules`
(their unit tests in deploy/observability/prometheus/loraplex-rules.test.yml), and the metrics
table of docs/observability.md equal to what scripts/metrics_doc.py generates from the code. The
rules' metric names are checked against the code's by the real-Prometheus test
(test_observability_dashboard.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "observability" / "prometheus"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("LORAPLEX_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("LORAPLEX_REQUIRE_PROMETHEUS=1 but promtool is not installed")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def test_promtool_check_rules() -> None:
    out = subprocess.run([promtool(), "check", "rules", "loraplex-rules.yml"], cwd=PROM, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests() -> None:
    out = subprocess.run(
        [promtool(), "test", "rules", "loraplex-rules.test.yml"], cwd=PROM, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_unit_test() -> None:
    rules = yaml.safe_load((PROM / "loraplex-rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROM / "loraplex-rules.test.yml").read_text())["tests"]
    tested = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    assert alerts - tested == set(), f"alerts without a firing unit test: {sorted(alerts - tested)}"


def test_rules_use_only_exported_metric_names() -> None:
    """Every loraplex:* name a rule reads is one the code exports (docs/observability.md's
    generated table is the list; a recording rule's own output names are job:/instance:/tenant:)."""
    doc = (ROOT / "docs" / "observability.md").read_text()
    exported = set(re.findall(r"`(loraplex:[a-z_]+)`", doc))
    text = (PROM / "loraplex-rules.yml").read_text()
    used = {re.sub(r"_(bucket|count|sum)$", "", n) for n in re.findall(r"\b(loraplex:[a-z_]+)", text)}
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"


def test_metrics_doc_is_generated_from_the_code() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "metrics_doc.py"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr + "\nrun: .venv/bin/python scripts/metrics_doc.py"
