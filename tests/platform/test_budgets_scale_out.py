"""Budgets in currency on ``loraplex serve --replicas 2`` (a real local Ray: two ingress replicas,
two engine replicas): 40 simultaneous streaming requests, spread over both ingresses, against a
budget with room for exactly 10 worst cases. The ingresses share the database, and each admission
locks the budget row there, so exactly 10 are admitted whichever ingress took them; the other 30
get OpenAI's 429 insufficient_quota, and once the streams close every hold is settled (nothing
reserved, the spend equal to the ledger's records)."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal

import httpx
import pytest
from billing_helpers import H, auth, new_tenant, usage_rows
from harness.ray import ServeCluster
from platform_helpers import ADMIN_KEY

pytest.importorskip("ray.serve", reason="the scale-out tests need loraplex[ray]")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

WAIT_S = 180
CONFIG = """
[engine]
kv_cache_memory_gb = 0.05
max_num_seqs = 16
[cluster]
replicas = 2
ingress_replicas = 2
replica_num_cpus = 0.5
ingress_num_cpus = 0.25
sync_interval_s = 0.5
chunk_timeout_s = 10
"""


async def _burst(url: str, key: str, body: dict, n: int) -> list[tuple[int, dict]]:
    """n simultaneous streams; each holds its stream open until all n have answered (so no
    admitted request settles during the burst)."""
    answered = asyncio.Event()
    count = [0]
    results: list[tuple[int, dict]] = []

    async def one(c: httpx.AsyncClient) -> None:
        async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            err = {}
            if r.status_code != 200:
                await r.aread()
                err = r.json()["error"]
            results.append((r.status_code, err))
            count[0] += 1
            if count[0] == n:
                answered.set()
            await answered.wait()

    async with httpx.AsyncClient(
        base_url=url, headers=auth(key), timeout=WAIT_S, limits=httpx.Limits(max_connections=n + 4)
    ) as c:
        await asyncio.wait_for(asyncio.gather(*[one(c) for _ in range(n)]), timeout=2 * WAIT_S)
    return results


def test_budget_is_exact_across_two_ingress_replicas(demo_model_dir, tmp_path):
    cluster = ServeCluster(tmp_path / "cluster", demo_model_dir, CONFIG, admin_key=ADMIN_KEY)
    try:
        tid, key = new_tenant(cluster.url, "spender", timeout=WAIT_S)
        with httpx.Client(base_url=cluster.url, headers=H, timeout=WAIT_S) as admin:
            price = {"model": "*", "input_per_mtok": "0", "output_per_mtok": "10000"}
            assert admin.post("/admin/v1/prices", json=price).status_code == 201
            # 400 output tokens x $0.01 = $4 per request: room for exactly 10
            assert admin.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "40"}).status_code == 200
        body = {"model": "demo", "prompt": [5, 6, 7, 8], "max_tokens": 400, "temperature": 0}
        res = asyncio.run(_burst(cluster.url, key, body, 40))
        codes = [c for c, _ in res]
        assert codes.count(200) == 10 and codes.count(429) == 30, res
        assert {e["code"] for c, e in res if c == 429} == {"insufficient_quota"}
        deadline = time.time() + WAIT_S
        while True:  # the closed streams settle (each ingress's worker)
            b = httpx.get(cluster.url + f"/admin/v1/tenants/{tid}/budget", headers=H, timeout=WAIT_S).json()
            rows = usage_rows(cluster.url, tid, timeout=WAIT_S)
            if b["reserved"] == "0" and len(rows) == 10 and all(r["status"] != "running" for r in rows.values()):
                break
            assert time.time() < deadline, (b, rows)
            time.sleep(0.3)
        want = sum((Decimal(r["completion_tokens"]) * Decimal("0.01") for r in rows.values()), Decimal(0))
        assert Decimal(b["spent"]) == want <= Decimal(40)
    finally:
        cluster.stop()
