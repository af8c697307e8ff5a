"""The money path end to end against a real served request (uvicorn, the demo model, the official
openai client), SQLite and PostgreSQL: a price for the base model, the same long prompt twice (the
second is served partly from the tenant's prefix cache), and every reader — the admin spend report,
its CSV export, the tenant's own costs endpoint — gives the cost hand arithmetic gives from the
usage records, to the last 10^-12."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone

import httpx
import openai
import pytest
from billing_helpers import H, new_tenant
from sqlalchemy import select

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.pricing.money import cost_text
from loraplex.platform.usage.models import UsageRecord

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time there was a little fox who lived in the deep green forest. " * 6


def test_a_served_request_costs_what_its_tokens_and_the_price_say(live_factory):
    live = live_factory()
    base = live.ctx.engine.model_name
    tid, key = new_tenant(live.url, "acme")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        r = admin.post(
            "/admin/v1/prices",
            json={"model": base, "input_per_mtok": "0.3", "cached_input_per_mtok": "0.03", "output_per_mtok": "1.2"},
        )
        assert r.status_code == 201, r.text
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0)
    start = int(datetime.now(timezone.utc).timestamp()) - 1
    for _ in range(2):
        out = client.completions.create(model=base, prompt=PROMPT, max_tokens=5, temperature=0)
        assert out.usage.completion_tokens >= 1
    live.ctx.ledger.flush()
    with unit_of_work(live.ctx.sessions) as s:
        recs = list(s.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tid).order_by(UsageRecord.id)))
        got = [(r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.base_model, r.status) for r in recs]
    assert len(got) == 2 and all(g[3] == base and g[4] == "ok" for g in got)
    assert got[0][1] == 0  # a cold cache
    assert 0 < got[1][1] < got[1][0]  # the repeat: whole blocks of its prompt from the prefix cache
    units = sum((p - c) * 300_000 + c * 30_000 + o * 1_200_000 for p, c, o, _b, _s in got)
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        report = admin.get("/admin/v1/spend", params={"group_by": "model", "tenant_id": tid}).json()
        assert report["data"] == [
            {
                "key": base,
                "requests": 2,
                "prompt_tokens": got[0][0] + got[1][0],
                "cached_tokens": got[1][1],
                "completion_tokens": got[0][2] + got[1][2],
                "cost": cost_text(units),
                "unpriced_requests": 0,
            }
        ]
        rows = list(csv.DictReader(io.StringIO(admin.get("/admin/v1/spend/export", params={"tenant_id": tid}).text)))
        assert [row["cost"] for row in rows] == [
            cost_text((p - c) * 300_000 + c * 30_000 + o * 1_200_000) for p, c, o, _b, _s in got
        ]
    end = int(datetime.now(timezone.utc).timestamp()) + 1
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as tenant:
        costs = tenant.get("/v1/organization/costs", params={"start_time": start, "end_time": end}).json()
        assert [r["amount"]["value_exact"] for bk in costs["data"] for r in bk["results"]] == [cost_text(units)]
        usage = tenant.get("/v1/organization/usage/completions", params={"start_time": start, "end_time": end}).json()
        results = [r for bk in usage["data"] for r in bk["results"]]
        assert [(r["input_tokens"], r["input_cached_tokens"], r["num_model_requests"]) for r in results] == [
            (got[0][0] + got[1][0], got[1][1], 2)
        ]
