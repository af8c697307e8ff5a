"""Hostile probes of the price book, spend, the organization usage/costs endpoints and the webhook
API (hostile3 review). Each probe: bad input is a 4xx with an OpenAI-style body, never a 5xx.

The parametrized probes share one app and database per backend (``module_client``): their oracle is
the status of their own request, and none of their inputs repeats a price's model and start or a
tenant's name, so an earlier probe cannot turn a later one into a 409 before the code it probes.
The two tests whose oracle is the state (the book's one currency, what tenant A can read of B) get
a fresh app each (``client``)."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from platform_helpers import admin_headers, tenant, tenant_key

H = admin_headers()
LOG: list[str] = []


def _rec(name, r):
    body = r.text[:160].replace("\n", " ")
    LOG.append(f"{name} | {r.status_code} | {body}")
    return r


def _price(client, **body):
    base = {"model": "*", "input_per_mtok": "1", "output_per_mtok": "2"}
    base.update(body)
    return client.post("/admin/v1/prices", json=base, headers=H)


RATES = [
    "1e9",
    "NaN",
    "-0",
    "0.0000001",
    "9" * 10000,
    "\u0661\u0662",
    " 0.15 ",
    "0.15\n",
    "+1",
    "1_000",
    "0x10",
    "Infinity",
    "1.",
    ".5",
    "\u00b2",
    "1000000",
    "1000000.000001",
    "00000001",
]


@pytest.mark.parametrize("rate", RATES)
def test_price_rates(module_client, rate):
    client = module_client
    r = _rec(f"price rate {rate[:20]!r}", _price(client, input_per_mtok=rate))
    assert r.status_code < 500


DATES = [
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59-05:00",
    "0001-01-01T00:00:00+01:00",
    "2030-01-01T00:00:00",
    "garbage",
    "1970-01-01T00:00:00Z",
    "2030-01-01T00:00:00+23:59",
    "275760-09-13T00:00:00Z",
]


@pytest.mark.parametrize("at", DATES)
def test_price_effective_from(module_client, at):
    client = module_client
    r = _rec(f"price effective_from {at!r}", _price(client, effective_from=at))
    assert r.status_code < 500
    r = _rec(f"spend after price {at!r}", client.get("/admin/v1/spend", headers=H))
    assert r.status_code < 500


MODELS = ["a\x00b", "\ud800", "x" * 10000, "   ", "*", "../../etc", "a" * 255]


@pytest.mark.parametrize("model", MODELS)
def test_price_model_names(module_client, model):
    client = module_client
    raw = json.dumps({"model": model, "input_per_mtok": "1", "output_per_mtok": "2"})
    r = _rec(
        f"price model {model[:12]!r}",
        client.post("/admin/v1/prices", content=raw, headers={**H, "content-type": "application/json"}),
    )
    assert r.status_code < 500
    q = quote(model, safe="", errors="surrogatepass")  # a lone surrogate as its (invalid) UTF-8 bytes
    r = _rec(f"list prices model={model[:12]!r}", client.get(f"/admin/v1/prices?model={q}", headers=H))
    assert r.status_code < 500


def test_currency_mismatch(client):
    assert _rec("price USD", _price(client, currency="USD")).status_code == 201
    r = _rec("price EUR after USD", _price(client, currency="EUR", model="m2"))
    assert r.status_code == 400
    r = _rec("price usd lowercase", _price(client, currency="usd", model="m3"))
    assert r.status_code == 201
    r = _rec("price currency 'ÄÖÜ'", _price(client, currency="\u00c4\u00d6\u00dc", model="m4"))
    assert r.status_code < 500


SPEND_Q = [
    {"start": "2030-01-02T00:00:00Z", "end": "2030-01-01T00:00:00Z"},
    {"start": "-1"},
    {"start": str(2**63)},
    {"start": "9999-12-31T23:59:59-05:00"},
    {"start": "0001-01-01T00:00:00+01:00"},
    {"start": "2030-01-01T00:00:00"},
    {"group_by": "garbage"},
    {"group_by": "project"},
    {"tenant_id": "ten_missing"},
    {"tenant_id": "\x00"},
    {"tenant_id": "x" * 10000},
    {"group_by": ["day"] * 1000},
]


@pytest.mark.parametrize("q", SPEND_Q, ids=range(len(SPEND_Q)))
@pytest.mark.parametrize("path", ["/admin/v1/spend", "/admin/v1/spend/export"])
def test_spend_params(module_client, q, path):
    client = module_client
    r = _rec(f"GET {path} {str(q)[:60]}", client.get(path, params=q, headers=H))
    assert r.status_code < 500


@pytest.fixture(scope="module")
def org_probe_key(module_client):
    """The key the organization probes read with (one tenant per module: names are unique)."""
    return tenant_key(module_client, tenant(module_client, "orgprobe"))


ORG_Q = [
    {"start_time": "100", "end_time": "50"},
    {"start_time": "-1"},
    {"start_time": str(2**63)},
    {"start_time": "0", "bucket_width": "garbage"},
    {"start_time": "0", "limit": "0"},
    {"start_time": "0", "limit": str(10**9)},
    {"start_time": "0", "page": "page_\u00b2"},
    {"start_time": "0", "page": "page_\u0661"},
    {"start_time": "0", "page": "forged"},
    {"start_time": "0", "page": "page_999999999999"},
    {"start_time": "0", "group_by": ["model"] * 1000},
    {"start_time": "0", "group_by": "line_item"},
    {"start_time": "0", "bucket_width": "1m", "limit": "1440"},
    {"start_time": "253402300799"},
    {"start_time": "253402300800"},
    {"start_time": "0", "end_time": "253402300800", "bucket_width": "1m", "page": "page_253402300740"},
    {"start_time": "0", "api_key_ids": "x" * 20000},
    {"start_time": "0", "models": ",".join(["m"] * 5000)},
]


@pytest.mark.parametrize("q", ORG_Q, ids=range(len(ORG_Q)))
@pytest.mark.parametrize("path", ["/v1/organization/usage/completions", "/v1/organization/costs"])
def test_org_params(module_client, org_probe_key, q, path):
    client, key = module_client, org_probe_key
    r = _rec(f"GET {path} {str(q)[:70]}", client.get(path, params=q, headers={"Authorization": f"Bearer {key}"}))
    assert r.status_code < 500


def test_org_cross_tenant(client):
    a_key = tenant_key(client, tenant(client, "a"))
    b_tid = tenant(client, "b")
    tenant_key(client, b_tid)
    b_key_id = client.get(f"/admin/v1/tenants/{b_tid}/keys", headers=H).json()["data"][0]["id"]
    for q in ({"tenant_id": b_tid}, {"organization_id": b_tid}, {"api_key_ids": b_key_id}, {"project_ids": b_tid}):
        hdrs = {"Authorization": f"Bearer {a_key}", "OpenAI-Organization": b_tid}
        for path in ("/v1/organization/usage/completions", "/v1/organization/costs"):
            r = _rec(f"A reads B {path} {q}", client.get(path, params={"start_time": "0", **q}, headers=hdrs))
            assert r.status_code < 500
            assert b_key_id not in r.text


WEBHOOK_URLS = [
    "http://127.0.0.1/",
    "http://169.254.169.254/latest/",
    "http://[::1]/",
    "http://2130706433/",
    "http://localhost./",
    "http://0x7f.1/",
    "http://127.1/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://0.0.0.0/",
    "http://[fe80::1%25eth0]/",
    "http://[64:ff9b::7f00:1]/",
    "http://[::127.0.0.1]/",
    "file:///etc/passwd",
    "http://user:pw@example.com/",
    "http://example.com:99999/",
    "http://[::1/",
    "http://\x00/",
    "http://%31%32%37.0.0.1/",
    "gopher://127.0.0.1/",
]


@pytest.mark.parametrize("url", WEBHOOK_URLS)
def test_webhook_ssrf(module_client, url):
    client = module_client
    r = _rec(f"webhook {url!r}", client.post("/admin/v1/webhooks", json={"url": url, "secret": "s" * 32}, headers=H))
    assert r.status_code < 500


def test_webhook_huge_secret_and_many(module_client):
    client = module_client
    r = _rec(
        "webhook secret 1MB",
        client.post("/admin/v1/webhooks", json={"url": "https://93.184.216.34/", "secret": "s" * 10**6}, headers=H),
    )
    assert r.status_code < 500
    r = _rec("alerts events limit=0", client.get("/admin/v1/alerts/events", params={"limit": 0}, headers=H))
    assert r.status_code < 500
    r = _rec("alerts events type=bad", client.get("/admin/v1/alerts/events", params={"type": "x"}, headers=H))
    assert r.status_code < 500


def teardown_module(module):
    with open("/tmp/h3-probes.log", "a") as f:
        f.write("\n".join(LOG) + "\n")


@pytest.mark.parametrize(
    "url",
    [
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[64:ff9b::7f00:1]/",
        "http://[::127.0.0.1]/",
        "http://[2002:a9fe:a9fe::1]/",
    ],
)
def test_webhook_ipv6_carrying_private_ipv4_refused(url):
    """NAT64 / IPv4-compatible / 6to4 addresses carry an IPv4 address a gateway delivers to; Python
    calls 64:ff9b::a9fe:a9fe global, so the check looks at the IPv4 address inside."""
    from loraplex.platform.alerts.urls import UnsafeUrl, check_url
    from loraplex.platform.settings import AlertSettings

    with pytest.raises(UnsafeUrl):
        check_url(url, AlertSettings())
    check_url("http://[64:ff9b::5db8:d822]/", AlertSettings())  # a public IPv4 behind NAT64 stays allowed
