"""Projects end to end on a real uvicorn server with the official ``openai`` client: a project's
keys generate (chat, streaming, n > 1, a prompt list), every usage record names the project, the
engine gets the project as the request's fair group, and spend / the tenant's Usage and Costs APIs
group by the real project ids. SQLite and PostgreSQL."""

from __future__ import annotations

import billing_helpers
import httpx
import openai
from platform_helpers import admin_headers
from sqlalchemy import select

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.usage.models import UsageRecord


def _records(ctx, tid) -> list[UsageRecord]:
    ctx.ledger.flush()
    with unit_of_work(ctx.sessions) as s:
        rows = list(s.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tid)))
        s.expunge_all()
    return rows


def test_project_keys_serve_and_are_billed_by_project(tenant_setup):
    ctx, url, tid, tenant_key, _ada, plain = tenant_setup
    admin = httpx.Client(base_url=url, headers=admin_headers(), timeout=30)
    assert (
        admin.post("/admin/v1/prices", json={"model": "*", "input_per_mtok": "1", "output_per_mtok": "2"}).status_code
        == 201
    )
    search = admin.post(f"/admin/v1/tenants/{tid}/projects", json={"name": "search", "weight": 3, "priority": 1}).json()
    ads = admin.post(f"/admin/v1/tenants/{tid}/projects", json={"name": "ads", "models": ["bot"]}).json()
    k_search = admin.post(f"/admin/v1/tenants/{tid}/keys", json={"project_id": search["id"]}).json()
    k_ads = admin.post(f"/admin/v1/tenants/{tid}/keys", json={"project_id": ads["id"]}).json()
    c_search = openai.OpenAI(base_url=url + "/v1", api_key=k_search["key"], max_retries=0, timeout=60)
    c_ads = openai.OpenAI(base_url=url + "/v1", api_key=k_ads["key"], max_retries=0, timeout=60)

    msgs = [{"role": "user", "content": "hello"}]
    assert c_search.chat.completions.create(model="bot", messages=msgs, max_tokens=3).choices
    stream = c_search.chat.completions.create(model="bot", messages=msgs, max_tokens=3, stream=True)
    assert sum(1 for _ in stream) > 0
    assert len(c_search.completions.create(model="bot", prompt="hi", max_tokens=2, n=2).choices) == 2
    assert len(c_ads.completions.create(model="bot", prompt=["a", "b", "c"], max_tokens=2).choices) == 3
    assert plain.completions.create(model="bot", prompt="hi", max_tokens=2).choices  # a key of no project
    # the project's allowlist: the base model is the tenant's but not this project's
    try:
        c_ads.completions.create(model=ctx.engine.model_name, prompt="hi", max_tokens=2)
        raise AssertionError("the project's allowlist must refuse the base model")
    except openai.PermissionDeniedError as exc:
        assert exc.code == "model_not_allowed"

    # the engine saw each project as a fair group of the tenant, with its weight and priority
    groups = ctx.engine.engine.engine.groups
    assert (groups[tid, search["id"]].weight, groups[tid, search["id"]].priority) == (3.0, 1)
    assert (groups[tid, ads["id"]].weight, groups[tid, ads["id"]].priority) == (1.0, 0)

    records = _records(ctx, tid)
    by_project: dict = {}
    for r in records:
        by_project[r.project_id] = by_project.get(r.project_id, 0) + 1
    assert by_project == {search["id"]: 3, ads["id"]: 3, None: 1}  # n=2 is one record; a 3-prompt list is 3

    exported = billing_helpers.usage_rows(url, tid)  # the usage export names the project too
    assert sorted(str(r["project_id"]) for r in exported.values()) == sorted(str(r.project_id) for r in records)
    spend = admin.get("/admin/v1/spend", params={"group_by": "project", "tenant_id": tid}).json()
    got = {b["key"]: b["requests"] for b in spend["data"]}
    assert got == {search["id"]: 3, ads["id"]: 3, "": 1}, spend
    assert spend["totals"]["requests"] == 7

    start = int(min(r.created_at for r in records).timestamp())
    usage = httpx.get(
        url + "/v1/organization/usage/completions",
        params=[("start_time", start), ("bucket_width", "1d"), ("group_by", "project_id")],
        headers=admin_headers(tenant_key),
    ).json()
    results = [r for b in usage["data"] for r in b["results"]]
    assert {r["project_id"]: r["num_model_requests"] for r in results} == {search["id"]: 3, ads["id"]: 3, None: 1}
    only = httpx.get(
        url + "/v1/organization/costs",
        params=[("start_time", start), ("group_by", "project_id"), ("project_ids", ads["id"])],
        headers=admin_headers(tenant_key),
    ).json()
    costs = [r for b in only["data"] for r in b["results"]]
    assert [r["project_id"] for r in costs] == [ads["id"]] and costs[0]["amount"]["value"] > 0
    admin.close()
