"""Budgets in currency over HTTP, SQLite and PostgreSQL: the admin routes (PUT/GET/DELETE on
tenants and keys, the project route's 404 until projects exist, hostile amounts and timezones
answered 422 in OpenAI's error shape) and, on a real uvicorn server with the official openai
client, the refusal (openai.RateLimitError, code insufficient_quota) for plain, n > 1, prompt-list
and streaming requests, settlement to the actual cost, and 20 concurrent requests that never spend
past the budget."""

from __future__ import annotations

import concurrent.futures
from decimal import Decimal

import httpx
import openai
import pytest
from billing_helpers import H, new_tenant
from platform_helpers import admin_headers
from sqlalchemy import select

from loraplex.platform.budgets.models import BudgetHold
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.usage.models import UsageRecord


def _tenant_and_key(client) -> tuple[str, str]:
    tid = client.post("/admin/v1/tenants", json={"name": "acme"}, headers=admin_headers()).json()["id"]
    kid = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=admin_headers()).json()["id"]
    return tid, kid


def test_put_get_delete_a_tenants_and_a_keys_budget(client):
    tid, kid = _tenant_and_key(client)
    for path in (f"/admin/v1/tenants/{tid}/budget", f"/admin/v1/keys/{kid}/budget"):
        assert client.get(path, headers=H).status_code == 404
        r = client.put(path, json={"amount": "25.5", "period": "daily", "timezone": "Asia/Tokyo"}, headers=H)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["amount"] == "25.5" and body["currency"] == "USD" and body["period"] == "daily"
        assert body["spent"] == "0" and body["reserved"] == "0" and body["remaining"] == "25.5"
        assert body["window_start"].endswith("15:00:00Z") or "15:00:00" in body["window_start"]  # Tokyo midnight
        r = client.put(path, json={"amount": "0.000001", "period": "total"}, headers=H)
        assert r.json()["amount"] == "0.000001" and r.json()["window_end"] is None
        assert client.get(path, headers=H).json()["period"] == "total"
        assert client.delete(path, headers=H).status_code == 204
        assert client.get(path, headers=H).status_code == 404
        assert client.delete(path, headers=H).status_code == 404
    audit = client.get("/admin/v1/audit", headers=H).json()
    actions = [e["action"] for e in audit.get("data", audit if isinstance(audit, list) else [])]
    assert "budget.put" in actions and "budget.delete" in actions


@pytest.mark.parametrize(
    "amount",
    [
        "-1",
        "NaN",
        "nan",
        "Infinity",
        "1e3",
        "1E-2",
        "١٢",
        "１２",
        "1,000",
        " 1",
        "1 ",
        "+1",
        "0x10",
        "",
        ".5",
        "1.",
        "1.0000001",
        "1000000.000001",
        "99999999",
        "9" * 400,
        12,
        12.5,
        None,
        True,
        [],
        {},
    ],
)
def test_hostile_amounts_are_422_in_openais_shape(client, amount):
    tid, _ = _tenant_and_key(client)
    r = client.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": amount}, headers=H)
    assert r.status_code == 422, (amount, r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["param"] == "amount"


@pytest.mark.parametrize(
    "tz",
    [
        "Mars/Olympus",
        "../../etc/passwd",
        "/etc/localtime",
        "Europe/Paris\x00",
        "Éurope/Paris",
        "",
        "x" * 100,
        "posixrules",
    ],
)
def test_unknown_timezones_are_422(client, tz):
    tid, _ = _tenant_and_key(client)
    r = client.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "1", "timezone": tz}, headers=H)
    assert r.status_code == 422, (tz, r.text)
    assert "error" in r.json()


def test_bad_period_unknown_owner_and_projects(client):
    tid, _ = _tenant_and_key(client)
    r = client.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "1", "period": "hourly"}, headers=H)
    assert r.status_code == 422
    r = client.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "1", "extra": 1}, headers=H)
    assert r.status_code == 422
    assert client.put("/admin/v1/tenants/ten_nope/budget", json={"amount": "1"}, headers=H).status_code == 404
    assert client.put("/admin/v1/keys/key_nope/budget", json={"amount": "1"}, headers=H).status_code == 404
    r = client.put("/admin/v1/projects/prj_1/budget", json={"amount": "1"}, headers=H)
    assert r.status_code == 404 and r.json()["error"]["message"] == "project not found"
    assert client.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "1"}).status_code == 401
    r = client.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "1", "currency": "EUR"}, headers=H)
    assert r.status_code == 200  # no price book yet: any currency
    client.post("/admin/v1/prices", json={"model": "*", "input_per_mtok": "1", "output_per_mtok": "1"}, headers=H)
    r = client.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "1", "currency": "EUR"}, headers=H)
    assert r.status_code == 422 and "USD" in r.json()["error"]["message"]


# -- served requests ---------------------------------------------------------------------------

PRICE = {"model": "*", "input_per_mtok": "1000", "cached_input_per_mtok": "100", "output_per_mtok": "10000"}


def _served(live, tid: str, key: str) -> list[UsageRecord]:
    live.ctx.ledger.flush()
    live.ctx.budgets.flush()
    with unit_of_work(live.ctx.sessions) as s:
        rows = list(s.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tid)))
        s.expunge_all()
        return rows


def _cost(rows, input_price: str = "0.001", cached_price: str = "0.0001") -> Decimal:
    # per token: $1000 / $100 / $10000 per million tokens (PRICE)
    return sum(
        (
            Decimal(r.prompt_tokens - r.cached_tokens) * Decimal(input_price)
            + Decimal(r.cached_tokens) * Decimal(cached_price)
            + Decimal(r.completion_tokens) * Decimal("0.01")
            for r in rows
        ),
        Decimal(0),
    )


@pytest.mark.slow
def test_served_requests_are_held_settled_and_refused_with_insufficient_quota(live_factory):
    live = live_factory()
    tid, key = new_tenant(live.url, "acme")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        assert admin.post("/admin/v1/prices", json=PRICE).status_code == 201
        assert admin.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "1"}).status_code == 200
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=60)
    model = live.ctx.engine.model_name
    # ~5 prompt tokens at $0.001 + 4 output at $0.01: well inside $1; settles to its actual cost
    client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, temperature=0)
    with client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, stream=True) as s:
        for _ in s:
            pass
    rows = _served(live, tid, key)
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        got = admin.get(f"/admin/v1/tenants/{tid}/budget").json()
    assert Decimal(got["spent"]) == _cost(rows) > 0 and got["reserved"] == "0"
    # n x max_tokens at the output price: 2 x 60 x $0.01 = $1.20 > what is left
    with pytest.raises(openai.RateLimitError) as e:
        client.completions.create(model=model, prompt="Once upon a time", max_tokens=60, n=2)
    assert e.value.code == "insufficient_quota" and e.value.body["type"] == "insufficient_quota"
    assert "budget" in e.value.message
    # a prompt list: each prompt counted (3 x 40 x $0.01 = $1.20), refused whole
    with pytest.raises(openai.RateLimitError) as e:
        client.completions.create(model=model, prompt=["a", "b", "c"], max_tokens=40)
    assert e.value.code == "insufficient_quota"
    with pytest.raises(openai.RateLimitError):  # streaming: refused before any byte
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=200, stream=True
        )
    assert len(_served(live, tid, key)) == len(rows)  # the refused ones were never served
    with unit_of_work(live.ctx.sessions) as s:
        assert s.scalars(select(BudgetHold)).first() is None  # nothing held after the refusals
    # the three refusals are one limit.refused event of the window (rule "budget", unit "USD")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        events = admin.get("/admin/v1/alerts/events").json()["data"]
    budget = [e for e in events if e["data"]["rule"] == "budget" and e["tenant_id"] == tid]
    assert [e["type"] for e in budget if e["type"] == "limit.refused"] == ["limit.refused"]
    refused = next(e for e in budget if e["type"] == "limit.refused")["data"]
    assert (refused["unit"], refused["limit"], refused["scope"]) == ("USD", 1_000_000, "tenant")


@pytest.mark.slow
def test_a_keys_budget_refuses_that_key_only(live_factory):
    live = live_factory()
    tid, key = new_tenant(live.url, "acme")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        admin.post("/admin/v1/prices", json=PRICE)
        other = admin.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()
        kid = admin.get(f"/admin/v1/tenants/{tid}/keys").json()
        kid = next(k["id"] for k in (kid["data"] if isinstance(kid, dict) else kid) if k["id"] != other["id"])
        assert admin.put(f"/admin/v1/keys/{kid}/budget", json={"amount": "0.01"}).status_code == 200
    model = live.ctx.engine.model_name
    limited = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.RateLimitError) as e:
        limited.completions.create(model=model, prompt="x", max_tokens=5)
    assert e.value.code == "insufficient_quota" and "key's budget" in e.value.message
    free = openai.OpenAI(base_url=live.url + "/v1", api_key=other["key"], max_retries=0)
    free.completions.create(model=model, prompt="x", max_tokens=5)


@pytest.mark.slow
def test_a_projects_budget_refuses_its_keys_only_and_an_archived_project_has_none(live_factory):
    """Budgets and projects merged: a key of the project is charged against the project's budget;
    a key of the same tenant outside the project is not."""
    live = live_factory()
    tid, outside_key = new_tenant(live.url, "acme")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        admin.post("/admin/v1/prices", json=PRICE)
        pid = admin.post(f"/admin/v1/tenants/{tid}/projects", json={"name": "search"}).json()["id"]
        inside = admin.post(f"/admin/v1/tenants/{tid}/keys", json={"project_id": pid}).json()
        r = admin.put(f"/admin/v1/projects/{pid}/budget", json={"amount": "0.01"})
        assert r.status_code == 200, r.text
        assert admin.get(f"/admin/v1/projects/{pid}/budget").json()["amount"] == "0.01"
    model = live.ctx.engine.model_name
    limited = openai.OpenAI(base_url=live.url + "/v1", api_key=inside["key"], max_retries=0)
    with pytest.raises(openai.RateLimitError) as e:
        limited.completions.create(model=model, prompt="x", max_tokens=5)  # 5 x $0.01 > $0.01
    assert e.value.code == "insufficient_quota" and "project's budget" in e.value.message
    free = openai.OpenAI(base_url=live.url + "/v1", api_key=outside_key, max_retries=0)
    free.completions.create(model=model, prompt="x", max_tokens=5)
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        assert admin.delete(f"/admin/v1/projects/{pid}").status_code in (200, 204)
        r = admin.put(f"/admin/v1/projects/{pid}/budget", json={"amount": "1"})
        assert r.status_code == 404 and r.json()["error"]["message"] == "project not found"


@pytest.mark.slow
def test_twenty_concurrent_requests_never_spend_past_the_budget(live_factory):
    live = live_factory()
    tid, key = new_tenant(live.url, "acme")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        admin.post("/admin/v1/prices", json={"model": "*", "input_per_mtok": "0", "output_per_mtok": "10000"})
        # each request may cost 8 x $0.01 = $0.08: room for 5 worst cases, one micro-dollar short of 6
        assert admin.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "0.479999"}).status_code == 200
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, max_retries=0, timeout=120)
    model = live.ctx.engine.model_name

    def one(i: int) -> str:
        try:
            client.completions.create(model=model, prompt=f"story {i}", max_tokens=8)
            return "ok"
        except openai.RateLimitError as exc:
            assert exc.code == "insufficient_quota"
            return "refused"

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(one, range(20)))
    rows = [r for r in _served(live, tid, key) if r.status == "ok"]
    assert results.count("ok") == len(rows) >= 5 and results.count("refused") >= 1
    spent = _cost(rows, "0", "0")
    assert spent <= Decimal("0.479999")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        got = admin.get(f"/admin/v1/tenants/{tid}/budget").json()
    assert Decimal(got["spent"]) == spent and got["reserved"] == "0"


@pytest.mark.slow
def test_a_stream_the_client_leaves_is_settled_to_what_it_was_sent(live_factory):
    live = live_factory()
    tid, key = new_tenant(live.url, "acme")
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        admin.post("/admin/v1/prices", json=PRICE)
        admin.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "100"})
    body = {"model": live.ctx.engine.model_name, "prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=60) as c,
        c.stream("POST", live.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break  # leave mid-stream

    def settled() -> bool:
        live.ctx.budgets.flush()
        with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
            return admin.get(f"/admin/v1/tenants/{tid}/budget").json()["reserved"] == "0"

    from harness.wait import wait_for

    wait_for(settled, what="the abandoned stream settled", timeout=60, interval=0.1)
    rows = _served(live, tid, key)
    assert len(rows) == 1 and rows[0].status != "running" and rows[0].completion_tokens < 2000
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        assert Decimal(admin.get(f"/admin/v1/tenants/{tid}/budget").json()["spent"]) == _cost(rows)


@pytest.mark.parametrize("sid", ["%00", "a%00b", "x" * 2000, "%F0%9F%92%A5", "..%2F..", "' OR 1=1 --"])
def test_hostile_ids_are_404_never_500(client, sid):
    for collection in ("tenants", "keys", "projects"):
        r = client.put(f"/admin/v1/{collection}/{sid}/budget", json={"amount": "1"}, headers=H)
        assert r.status_code in (400, 404), (collection, sid, r.status_code, r.text)
        assert "error" in r.json()
        assert client.get(f"/admin/v1/{collection}/{sid}/budget", headers=H).status_code in (400, 404)


@pytest.mark.slow
def test_the_official_client_does_not_retry_a_spent_budget(live_factory):
    """openai's client retries a 429 twice by default; a spent budget answers with a Retry-After
    past its patience (the period's end) or, for "total", x-should-retry: false: one request each."""
    live = live_factory()
    tid, key = new_tenant(live.url, "acme")
    model = live.ctx.engine.model_name
    with httpx.Client(base_url=live.url, headers=H, timeout=30) as admin:
        admin.post("/admin/v1/prices", json=PRICE)
        sent: list[str] = []
        http = httpx.Client(event_hooks={"request": [lambda req: sent.append(req.url.path)]})
        client = openai.OpenAI(base_url=live.url + "/v1", api_key=key, http_client=http)  # default retries
        for period in ("monthly", "total"):
            admin.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "0.000001", "period": period})
            sent.clear()
            with pytest.raises(openai.RateLimitError) as e:
                client.completions.create(model=model, prompt="x", max_tokens=5)
            assert e.value.code == "insufficient_quota"
            assert sent == ["/v1/completions"], (period, sent)
        http.close()
