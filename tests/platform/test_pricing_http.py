"""The price book, spend and the OpenAI-shaped usage / costs endpoints over HTTP, on SQLite and
PostgreSQL: validation, history (a later price never reprices earlier records), most specific
price wins, exact sums (integers, compared as decimal text), the CSV export, and tenant scoping.

Prices can only start now or later, so the history is laid out in the future: prices from
tomorrow on, usage records seeded after them."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from platform_helpers import admin_headers, assert_error, tenant

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.pricing.money import cost_text
from loraplex.platform.usage.models import UsageRecord

H = admin_headers()
DAY = timedelta(days=1)


def _price(client, model, i, c, o, at=None, **extra):
    body = {"model": model, "input_per_mtok": i, "cached_input_per_mtok": c, "output_per_mtok": o, **extra}
    if at is not None:
        body["effective_from"] = at.isoformat()
    return client.post("/admin/v1/prices", json=body, headers=H)


def _key(client, tid) -> tuple[str, str]:
    body = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()
    return body["id"], body["key"]


def _seed(platform, rows):
    """rows: (request_id, tenant, key_id, adapter, base, at, prompt, cached, completion)."""
    with unit_of_work(platform.ctx.sessions) as s:
        s.add_all(
            [
                UsageRecord(
                    request_id=rid,
                    tenant_id=t,
                    api_key_id=k,
                    adapter_name=a,
                    base_model=b,
                    created_at=at,
                    prompt_tokens=p,
                    cached_tokens=c,
                    completion_tokens=o,
                    status="ok",
                )
                for rid, t, k, a, b, at, p, c, o in rows
            ]
        )


def _units(rate: tuple[int, int, int], p: int, c: int, o: int) -> int:
    """Hand arithmetic: micro-units per million tokens x tokens = units of 10^-12."""
    return (p - c) * rate[0] + c * rate[1] + o * rate[2]


def test_the_price_book_validates_and_keeps_history(client):
    now = datetime.now(timezone.utc)
    r = _price(client, "*", "0.15", "0.075", "0.6")
    assert r.status_code == 201, r.text
    star = r.json()
    assert (star["input_per_mtok"], star["cached_input_per_mtok"], star["output_per_mtok"]) == ("0.15", "0.075", "0.6")
    assert star["currency"] == "USD" and datetime.fromisoformat(star["effective_from"]) >= now - timedelta(seconds=1)
    # cached defaults to the input rate (no discount); a later price of the same model is history
    r = client.post(
        "/admin/v1/prices",
        json={"model": "*", "input_per_mtok": "1", "output_per_mtok": "2", "effective_from": (now + DAY).isoformat()},
        headers=H,
    )
    assert r.status_code == 201 and r.json()["cached_input_per_mtok"] == "1"
    assert_error(_price(client, "*", "1", "1", "2", now + DAY), 409, param="effective_from")
    # refusals, each naming the field
    assert_error(_price(client, "m", "-1", "0", "0"), 400, param="input_per_mtok")
    assert_error(_price(client, "m", "0.1234567", "0", "0"), 400, param="input_per_mtok", contains="6 digits")
    assert_error(_price(client, "m", "1", "1e3", "0"), 400, param="cached_input_per_mtok")
    assert_error(_price(client, "m", "1", "1", "99999999"), 400, param="output_per_mtok")
    assert_error(_price(client, "m", "1", "1", "1", currency="EUR"), 400, param="currency", contains="USD")
    assert_error(_price(client, "m", "1", "1", "1", now - timedelta(minutes=5)), 400, param="effective_from")
    assert_error(_price(client, " ", "1", "1", "1"), 400, param="model")
    floats = client.post(
        "/admin/v1/prices", json={"model": "m", "input_per_mtok": 0.1, "output_per_mtok": "1"}, headers=H
    )
    assert floats.status_code == 422  # a JSON number is refused: amounts are decimal strings
    naive = client.post(
        "/admin/v1/prices",
        json={"model": "m", "input_per_mtok": "1", "output_per_mtok": "1", "effective_from": "2099-01-01T00:00:00"},
        headers=H,
    )
    assert naive.status_code == 422
    assert client.post("/admin/v1/prices", json={"model": "m"}, headers=admin_headers("nope")).status_code == 401
    listed = client.get("/admin/v1/prices", headers=H).json()
    assert listed["currency"] == "USD"
    assert [(p["model"], p["input_per_mtok"]) for p in listed["data"]] == [("*", "0.15"), ("*", "1")]
    assert [p["id"] for p in client.get("/admin/v1/prices?model=nothing", headers=H).json()["data"]] == []
    audit = client.get("/admin/v1/audit", params={"action": "price.create"}, headers=H).json()["data"]
    assert len(audit) == 2 and {a["target_id"] for a in audit} == {star["id"], r.json()["id"]}


@pytest.fixture
def history(platform, client):
    """Prices from tomorrow on, and records of two tenants under each of them."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    t1, t2, t3 = now + DAY, now + 2 * DAY, now + 3 * DAY
    rates = {
        "star1": ("*", ("1", "0.5", "2"), t1),
        "base": ("base-x", ("0.3", "0.1", "0.9"), t1),
        "bot": ("bot", ("0.000001", "0", "0.000003"), t2),
        "star2": ("*", ("5", "5", "5"), t3),
    }
    ids = {}
    for name, (model, (i, c, o), at) in rates.items():
        r = _price(client, model, i, c, o, at)
        assert r.status_code == 201, r.text
        ids[name] = r.json()["id"]
    micros = {
        "star1": (1_000_000, 500_000, 2_000_000),
        "base": (300_000, 100_000, 900_000),
        "bot": (1, 0, 3),
        "star2": (5_000_000, 5_000_000, 5_000_000),
    }
    a, b = tenant(client, "acme"), tenant(client, "beta")
    hour = timedelta(hours=1)
    rows = [  # (id, tenant, key, adapter, base, at, prompt, cached, completion), the price it pays
        (("r0", a, "k1", "bot", "base-x", now + 12 * hour, 100, 0, 10), None),  # before any price
        (("r1", a, "k1", "bot", "base-x", t1 + hour, 1000, 256, 77), "base"),  # the adapter's base
        (("r2", a, "k2", "bot", "base-x", t2 + hour, 999_999, 3, 123_457), "bot"),  # the adapter's own
        (("r3", a, "k2", "zed", None, t3 + hour, 7, 7, 1), "star2"),  # no base: "*" at t3
        (("r4", a, "k1", None, "base-x", t3 + 2 * hour, 10, 4, 5), "base"),  # base price still in force
        (("r5", b, "k9", "zed", "other", t1 + 2 * hour, 40, 0, 2), "star1"),
    ]
    _seed(platform, [r for r, _ in rows])
    cost = {r[0]: (_units(micros[p], *r[6:]) if p else 0) for r, p in rows}
    return {"now": now, "t": (t1, t2, t3), "a": a, "b": b, "cost": cost, "ids": ids, "rows": [r for r, _ in rows]}


def _by_key(report):
    return {b["key"]: b for b in report["data"]}


def test_spend_prices_each_record_at_its_time_exactly(client, history):
    cost, a, b = history["cost"], history["a"], history["b"]
    rep = client.get("/admin/v1/spend", params={"group_by": "tenant"}, headers=H).json()
    assert rep["currency"] == "USD"
    tenants = _by_key(rep)
    assert tenants[a]["cost"] == cost_text(sum(cost[r] for r in ("r0", "r1", "r2", "r3", "r4")))
    assert tenants[b]["cost"] == cost_text(cost["r5"])
    assert tenants[a]["unpriced_requests"] == 1 and tenants[a]["requests"] == 5
    assert rep["totals"]["cost"] == cost_text(sum(cost.values()))
    assert rep["totals"]["cached_tokens"] == 256 + 3 + 7 + 4
    # r2 alone: 999,996 x 0.000001 + 3 x 0 + 123,457 x 0.000003 per million tokens
    assert cost_text(cost["r2"]) == "0.000001370367"
    keys = _by_key(client.get("/admin/v1/spend", params={"group_by": "key"}, headers=H).json())
    assert keys["k1"]["cost"] == cost_text(cost["r0"] + cost["r1"] + cost["r4"])
    models = _by_key(client.get("/admin/v1/spend", params={"group_by": "model"}, headers=H).json())
    assert set(models) == {"bot", "zed", "base-x"}
    assert models["zed"]["cost"] == cost_text(cost["r3"] + cost["r5"])
    days = client.get("/admin/v1/spend", params={"group_by": "day", "tenant_id": a}, headers=H).json()
    assert sum(Decimal(d["cost"]) for d in days["data"]) == Decimal(cost_text(sum(cost[r] for r in cost if r != "r5")))
    assert all(len(d["key"]) == 10 for d in days["data"])  # YYYY-MM-DD
    # a window: [t2, t3) holds r2 only
    t1, t2, t3 = history["t"]
    win = client.get("/admin/v1/spend", params={"start": t2.isoformat(), "end": t3.isoformat()}, headers=H).json()
    assert win["totals"]["requests"] == 1 and win["totals"]["cost"] == cost_text(cost["r2"])
    # a price added later never reprices what was served before it
    assert _price(client, "bot", "9", "9", "9", t3 + 10 * DAY).status_code == 201
    again = client.get("/admin/v1/spend", params={"group_by": "tenant"}, headers=H).json()
    assert again["totals"]["cost"] == rep["totals"]["cost"]


def test_spend_refusals(client, history):
    # projects exist now (platform/projects): group_by=project is answered (tests/platform/test_projects_*.py)
    assert client.get("/admin/v1/spend?group_by=week", headers=H).status_code == 422
    t1, t2, _ = history["t"]
    bad = client.get("/admin/v1/spend", params={"start": t2.isoformat(), "end": t1.isoformat()}, headers=H)
    assert_error(bad, 400, param="start")
    assert client.get("/admin/v1/spend?tenant_id=ten_nope", headers=H).status_code == 404
    assert client.get("/admin/v1/spend?start=2026-01-01T00:00:00", headers=H).status_code == 422  # no zone
    assert client.get("/admin/v1/spend/export?tenant_id=ten_nope", headers=H).status_code == 404
    assert client.get("/admin/v1/spend", headers=admin_headers("wrong")).status_code == 401


def test_spend_export_lists_every_record_with_its_price(client, history):
    r = client.get("/admin/v1/spend/export", headers=H)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = {row["request_id"]: row for row in csv.DictReader(io.StringIO(r.text))}
    assert set(rows) == {"r0", "r1", "r2", "r3", "r4", "r5"}
    for rid, units in history["cost"].items():
        assert rows[rid]["cost"] == cost_text(units)
    assert rows["r0"]["price_id"] == ""  # served before any price
    assert rows["r2"]["price_id"] == history["ids"]["bot"] and rows["r1"]["price_id"] == history["ids"]["base"]
    assert rows["r1"]["cached_tokens"] == "256" and rows["r1"]["currency"] == "USD"
    parts = sum(Decimal(rows["r1"][f]) for f in ("input_cost", "cached_input_cost", "output_cost"))
    assert parts == Decimal(rows["r1"]["cost"])
    total = client.get("/admin/v1/spend", headers=H).json()["totals"]["cost"]
    assert sum(Decimal(row["cost"]) for row in rows.values()) == Decimal(total)
    only_b = client.get("/admin/v1/spend/export", params={"tenant_id": history["b"]}, headers=H)
    assert [row["request_id"] for row in csv.DictReader(io.StringIO(only_b.text))] == ["r5"]


def _day_start(at: datetime) -> int:
    return int(at.timestamp()) // 86400 * 86400


@pytest.fixture
def org(platform, client):
    """Two tenants with keys; a price from tomorrow; records on the three days after it."""
    now = datetime.now(timezone.utc)
    assert _price(client, "*", "2", "1", "4", now + DAY).status_code == 201
    s = _day_start(now) + 2 * 86400  # a day boundary after the price
    a, b = tenant(client, "acme"), tenant(client, "beta")
    (ka1, key_a), (ka2, _), (kb, key_b) = _key(client, a), _key(client, a), _key(client, b)
    at = [datetime.fromtimestamp(s + d * 86400 + 3600, timezone.utc) for d in range(3)]
    _seed(
        platform,
        [
            ("o1", a, ka1, "bot", "base", at[0], 100, 40, 10),
            ("o2", a, ka2, None, "base", at[0], 50, 0, 5),
            ("o3", a, ka1, None, "base", at[2], 8, 8, 1),
            ("o4", b, kb, None, "base", at[0], 1000, 0, 1000),
        ],
    )
    return {"s": s, "a": a, "b": b, "ka1": ka1, "ka2": ka2, "kb": kb, "key_a": key_a, "key_b": key_b}


def _get(client, path, key, **params):
    return client.get(path, params=params, headers=admin_headers(key))


USAGE = "/v1/organization/usage/completions"
COSTS = "/v1/organization/costs"


def test_org_usage_is_openai_shaped_and_scoped_to_the_keys_tenant(client, org):
    s = org["s"]
    page = _get(client, USAGE, org["key_a"], start_time=s, end_time=s + 3 * 86400).json()
    assert page["object"] == "page" and page["has_more"] is False and page["next_page"] is None
    assert [(bk["object"], bk["start_time"], bk["end_time"]) for bk in page["data"]] == [
        ("bucket", s + d * 86400, s + (d + 1) * 86400) for d in range(3)
    ]
    first = page["data"][0]["results"]
    assert first == [
        {
            "object": "organization.usage.completions.result",
            "input_tokens": 150,
            "output_tokens": 15,
            "input_cached_tokens": 40,
            "input_audio_tokens": 0,
            "output_audio_tokens": 0,
            "num_model_requests": 2,
            "project_id": None,
            "user_id": None,
            "api_key_id": None,
            "model": None,
            "batch": None,
            "service_tier": None,
        }
    ]
    assert page["data"][1]["results"] == [] and page["data"][2]["results"][0]["input_tokens"] == 8
    # tenant b's key sees b's record only; tenant a's totals never include it
    other = _get(client, USAGE, org["key_b"], start_time=s, end_time=s + 3 * 86400).json()
    assert [r["input_tokens"] for bk in other["data"] for r in bk["results"]] == [1000]
    by_key = _get(client, USAGE, org["key_a"], start_time=s, end_time=s + 86400, group_by="api_key_id").json()
    assert {r["api_key_id"]: r["input_tokens"] for r in by_key["data"][0]["results"]} == {
        org["ka1"]: 100,
        org["ka2"]: 50,
    }
    # another tenant's key id filters to nothing (scoped), a model filter narrows
    foreign = _get(client, USAGE, org["key_a"], start_time=s, end_time=s + 86400, api_key_ids=org["kb"]).json()
    assert foreign["data"][0]["results"] == []
    by_model = client.get(
        USAGE,
        params=[("start_time", s), ("end_time", s + 86400), ("group_by", "model"), ("models", "bot")],
        headers=admin_headers(org["key_a"]),
    ).json()
    assert [(r["model"], r["input_tokens"]) for r in by_model["data"][0]["results"]] == [("bot", 100)]
    assert (
        _get(client, USAGE, org["key_a"], start_time=s, end_time=s + 1, project_ids="proj_x").json()["data"][0][
            "results"
        ]
        == []
    )
    # a key scoped to "bot" reads bot's usage only, and is refused another model's
    scoped = client.post(f"/admin/v1/tenants/{org['a']}/keys", json={"allowed_models": ["bot"]}, headers=H).json()
    mine = _get(client, USAGE, scoped["key"], start_time=s, end_time=s + 86400).json()
    assert [r["input_tokens"] for r in mine["data"][0]["results"]] == [100]
    assert_error(_get(client, USAGE, scoped["key"], start_time=s, end_time=s + 1, models="base"), 403)
    # hourly buckets: the records sit in the second hour
    hourly = _get(client, USAGE, org["key_a"], start_time=s, end_time=s + 86400, bucket_width="1h").json()
    assert len(hourly["data"]) == 24 and [len(bk["results"]) for bk in hourly["data"][:3]] == [0, 1, 0]


def test_org_usage_pages_through_buckets(client, org):
    s, key = org["s"], org["key_a"]
    seen, page, calls = [], None, 0
    while True:
        params = {"start_time": s, "end_time": s + 3 * 86400, "limit": 2}
        if page:
            params["page"] = page
        body = _get(client, USAGE, key, **params).json()
        calls += 1
        seen += [bk["start_time"] for bk in body["data"]]
        if not body["has_more"]:
            assert body["next_page"] is None
            break
        page = body["next_page"]
    assert calls == 2 and seen == [s, s + 86400, s + 2 * 86400]


def test_org_costs_are_exact_and_scoped(client, org):
    s = org["s"]
    body = _get(client, COSTS, org["key_a"], start_time=s, end_time=s + 3 * 86400).json()
    assert body["object"] == "page" and len(body["data"]) == 3
    result = body["data"][0]["results"][0]
    assert result["object"] == "organization.costs.result" and result["line_item"] is None
    # (60 x 2 + 40 x 1 + 10 x 4) + (50 x 2 + 5 x 4) micro-units per million tokens
    units = 60 * 2_000_000 + 40 * 1_000_000 + 10 * 4_000_000 + 50 * 2_000_000 + 5 * 4_000_000
    assert result["amount"] == {"value": float(cost_text(units)), "currency": "usd", "value_exact": cost_text(units)}
    lines = _get(client, COSTS, org["key_a"], start_time=s, end_time=s + 86400, group_by="line_item").json()
    items = {r["line_item"]: r["amount"]["value_exact"] for r in lines["data"][0]["results"]}
    assert items == {
        "bot, input": cost_text(60 * 2_000_000),
        "bot, cached input": cost_text(40 * 1_000_000),
        "bot, output": cost_text(10 * 4_000_000),
        "base, input": cost_text(50 * 2_000_000),
        "base, cached input": "0",
        "base, output": cost_text(5 * 4_000_000),
    }
    b = _get(client, COSTS, org["key_b"], start_time=s, end_time=s + 86400, group_by="api_key_id").json()
    assert [(r["api_key_id"], r["amount"]["value_exact"]) for r in b["data"][0]["results"]] == [
        (org["kb"], cost_text(1000 * 2_000_000 + 1000 * 4_000_000))
    ]


def test_org_endpoints_refuse_bad_input_with_openai_errors(client, org):
    s, key = org["s"] - 10 * 86400, org["key_a"]  # in the past: end_time may default to now
    assert _get(client, USAGE, "sk-wrong", start_time=s).status_code == 401
    assert client.get(USAGE, params={"start_time": s}).status_code == 401
    assert_error(_get(client, USAGE, key), 400, param="start_time")  # required
    assert_error(_get(client, USAGE, key, start_time=s, end_time=s), 400, param="end_time")
    assert_error(_get(client, USAGE, key, start_time=s, limit=32), 400, param="limit")
    assert_error(_get(client, USAGE, key, start_time=s, bucket_width="1w"), 400, param="bucket_width")
    assert_error(_get(client, USAGE, key, start_time=s, group_by="user_id"), 400, param="group_by")
    assert_error(_get(client, USAGE, key, start_time=s, page="page_abc"), 400, param="page")
    assert_error(_get(client, USAGE, key, start_time=s, end_time=s + 86400, page=f"page_{s + 7}"), 400, param="page")
    assert_error(_get(client, USAGE, key, start_time=-1), 400, param="start_time")
    assert_error(_get(client, USAGE, key, start_time=10**15), 400, param="start_time")
    assert_error(_get(client, COSTS, key, start_time=s, bucket_width="1h"), 400, param="bucket_width")
    assert_error(_get(client, COSTS, key, start_time=s, limit=181), 400, param="limit")
    assert_error(_get(client, COSTS, key, start_time=s, group_by="user_id"), 400, param="group_by")
    # the admin key is not a tenant's key
    assert _get(client, COSTS, admin_headers()["Authorization"].split()[1], start_time=s).status_code in (401, 403)
