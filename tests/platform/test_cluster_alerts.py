"""The Ray control plane's quota store raises the same ``limit.threshold`` / ``limit.refused`` events
as the local store (issue 37 gap): driven as a plain object against the same sequence as the local
store on SQLite and PostgreSQL, and end to end with ``loraplex serve --replicas 2`` (two ingress
replicas on a real local Ray) delivering to a real receiver once per event."""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections import Counter

import httpx
import pytest
from alerts_helpers import SECRET, Receiver
from harness.wait import wait_for
from platform_helpers import make_settings
from sqlalchemy import select

from loraplex.platform.alerts.models import AlertEventRow
from loraplex.platform.app import build_context
from loraplex.platform.cluster.control import ControlConfig, ControlPlane
from loraplex.platform.cluster.messages import Hold, Refusal, ReserveItem
from loraplex.platform.engine_client import LocalEngineClient
from loraplex.platform.errors import RateLimited
from loraplex.platform.pricing.money import cost_text
from loraplex.platform.quotas.store import QuotaView

# budget 100: 60 (50 %), +30 (80 %), +30 refused, a key's rpm of 1: one admitted, two refused
STEPS = [("t", QuotaView(token_budget=100), 60), ("t", QuotaView(token_budget=100), 30)]
STEPS += [("t", QuotaView(token_budget=100), 30)] * 2
STEPS += [("key:k1", QuotaView(rpm=1), 0)] * 3


def _kinds(sessions) -> Counter:
    with sessions() as s:
        rows = s.scalars(select(AlertEventRow)).all()
    out: Counter = Counter()
    for r in rows:
        d = json.loads(r.body)["data"]
        subject = f"key:{d['key_id']}" if d["scope"] == "key" else f"tenant:{d['tenant_id']}"
        out[(r.kind, subject, d["rule"], d["threshold_percent"])] += 1
    return out


def test_control_plane_emits_what_the_local_store_emits(tmp_path, db_url):
    settings = make_settings(tmp_path / "local", db_url)
    ctx, _ = build_context(settings, LocalEngineClient.disabled(), upgrade_db=False)
    local = ctx.quotas
    for scope, q, tokens in STEPS:
        try:
            local.reserve(scope, q, tokens)
        except RateLimited:
            pass
    expected = _kinds(ctx.sessions)
    assert expected == Counter(
        {
            ("limit.threshold", "tenant:t", "token_budget", 50): 1,
            ("limit.threshold", "tenant:t", "token_budget", 80): 1,
            ("limit.refused", "tenant:t", "token_budget", None): 1,
            ("limit.refused", "key:k1", "rpm", None): 1,
        }
    ), expected
    with ctx.sessions() as s:  # a second run of the same sequence on the control plane
        s.query(AlertEventRow).delete()
        s.commit()

    cp = ControlPlane(ControlConfig(db_url, alert_thresholds=(50, 80, 100)))
    answers = [cp.reserve_many("ingress-1", [ReserveItem(uuid.uuid4().hex, s, q, t)])[0] for s, q, t in STEPS]
    assert [type(a) for a in answers] == [Hold, Hold, Refusal, Refusal, Hold, Refusal, Refusal]
    assert cp.alert_writer is not None and cp.alert_writer.flush()
    wait_for(lambda: _kinds(ctx.sessions) == expected, timeout=30, details=lambda: str(_kinds(ctx.sessions)))
    cp.alert_writer.stop()


def test_control_plane_without_alerts_emits_nothing(tmp_path, db_url):
    cp = ControlPlane(ControlConfig(db_url))
    assert cp.alert_writer is None
    for s, q, t in STEPS:
        cp.reserve_many("i", [ReserveItem(uuid.uuid4().hex, s, q, t)])


CONFIG = """
[engine]
kv_cache_memory_gb = 0.05
max_num_seqs = 16
max_loras = 4
max_lora_rank = 16
[cluster]
replicas = 1
ingress_replicas = 2
replica_num_cpus = 0.5
ingress_num_cpus = 0.25
sync_interval_s = 0.5
[alerts]
dispatch_interval_s = 0.2
backoff_base_s = 0.2
backoff_max_s = 1.0
delivery_timeout_s = 5.0
lease_s = 8.0
allowed_hosts = ["127.0.0.1"]
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_replicas_deliver_the_control_planes_events_once(demo_model_dir, tmp_path):
    pytest.importorskip("ray.serve", reason="the scale-out tests need loraplex[ray]")
    import asyncio

    from billing_helpers import H, auth, new_tenant
    from harness.ray import ServeCluster
    from platform_helpers import ADMIN_KEY

    receiver = Receiver()
    cluster = ServeCluster(tmp_path / "cluster", demo_model_dir, CONFIG, replicas=1, admin_key=ADMIN_KEY)
    try:
        url = cluster.url
        tid, key = new_tenant(url, "alerted", quota={"token_budget": 400}, timeout=180)
        r = httpx.post(f"{url}/admin/v1/webhooks", json={"url": receiver.url, "secret": SECRET}, headers=H, timeout=180)
        assert r.status_code == 201, r.text
        price = {"model": "*", "input_per_mtok": "0.3", "output_per_mtok": "1.2"}
        assert httpx.post(f"{url}/admin/v1/prices", json=price, headers=H, timeout=180).status_code == 201
        body = {"model": "demo", "prompt": [5, 6, 7, 8], "max_tokens": 96, "temperature": 0, "ignore_eos": True}

        async def burst(n: int) -> list[int]:  # spread over both ingress replicas
            async with httpx.AsyncClient(base_url=url, headers=auth(key), timeout=180) as c:
                return [
                    r.status_code
                    for r in await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(n)])
                ]

        codes = asyncio.run(burst(8))  # each reserves 100 of 400: four admitted, four refused
        assert codes.count(200) == 4 and codes.count(429) == 4, codes
        want = {("limit.threshold", 50), ("limit.threshold", 80), ("limit.threshold", 100), ("limit.refused", None)}

        def delivered() -> set | None:
            got = {
                (r["body"]["type"], r["body"]["data"]["threshold_percent"])
                for r in receiver.all()
                if r["status"] == 200
            }
            return got if got >= want else None

        wait_for(delivered, timeout=180, what="the cluster's events delivered", details=lambda: str(receiver.all()))
        ids = receiver.accepted_ids()
        assert Counter(ids) == {i: 1 for i in set(ids)} and len(set(ids)) == 4, receiver.all()
        assert all(r["verified"] and r["body"]["data"]["tenant_id"] == tid for r in receiver.all())

        # money across the two ingresses: one spend line per admitted request, at the exact cost
        def lines() -> list[dict] | None:
            r = httpx.get(f"{url}/admin/v1/spend/export", params={"tenant_id": tid}, headers=H, timeout=180)
            got = list(csv.DictReader(io.StringIO(r.text)))
            return got if len(got) >= 4 and all(g["status"] != "running" for g in got) else None

        spent = wait_for(lines, timeout=180, what="the four records closed")
        assert len(spent) == 4 and len({g["request_id"] for g in spent}) == 4, spent
        for g in spent:
            units = int(g["prompt_tokens"]) * 300_000 + int(g["completion_tokens"]) * 1_200_000
            assert g["cost"] == cost_text(units) and int(g["completion_tokens"]) == 96, g
    finally:
        cluster.stop()
        receiver.stop()
