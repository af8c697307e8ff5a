from __future__ import annotations

from platform_helpers import admin_headers, assert_error

H = admin_headers()


def test_quota_put_get(client):
    tid = client.post("/admin/v1/tenants", json={"name": "acme"}, headers=H).json()["id"]
    r = client.get(f"/admin/v1/tenants/{tid}/quota", headers=H)
    assert r.status_code == 200
    assert r.json() == {
        "object": "quota",
        "tenant_id": tid,
        "rpm": None,
        "tpm": None,
        "max_concurrent": None,
        "token_budget": None,
        "budget_period": "month",
        "max_generation_s": None,
    }
    body = {
        "rpm": 60,
        "tpm": 10000,
        "max_concurrent": 4,
        "token_budget": 1_000_000,
        "budget_period": "day",
        "max_generation_s": 30.0,
    }
    r = client.put(f"/admin/v1/tenants/{tid}/quota", json=body, headers=H)
    assert r.status_code == 200 and r.json() == {"object": "quota", "tenant_id": tid, **body}
    assert client.get(f"/admin/v1/tenants/{tid}/quota", headers=H).json()["rpm"] == 60
    # PUT replaces: left-out limits become unlimited.
    r = client.put(f"/admin/v1/tenants/{tid}/quota", json={"rpm": 5}, headers=H)
    assert r.json()["tpm"] is None and r.json()["rpm"] == 5
    entries = client.get(f"/admin/v1/audit?target_id={tid}&action=quota.put", headers=H).json()["data"]
    assert entries[0]["before"]["rpm"] == 60 and entries[0]["after"]["rpm"] == 5


def test_quota_errors(client):
    tid = client.post("/admin/v1/tenants", json={"name": "acme"}, headers=H).json()["id"]
    key = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"]
    assert_error(client.put(f"/admin/v1/tenants/{tid}/quota", json={"rpm": 0}, headers=H), 422, param="rpm")
    assert_error(client.put(f"/admin/v1/tenants/{tid}/quota", json={"budget_period": "week"}, headers=H), 422)
    assert_error(client.put(f"/admin/v1/tenants/{tid}/quota", json={"rpm": "many"}, headers=H), 422)
    assert_error(
        client.put(f"/admin/v1/tenants/{tid}/quota", content=b"x", headers={**H, "content-type": "application/json"}),
        400,
    )
    assert_error(client.put("/admin/v1/tenants/ten_missing/quota", json={}, headers=H), 404)
    assert_error(client.get("/admin/v1/tenants/ten_missing/quota", headers=H), 404)
    assert_error(client.get(f"/admin/v1/tenants/{tid}/quota"), 401)
    assert_error(client.put(f"/admin/v1/tenants/{tid}/quota", json={}, headers=admin_headers(key)), 403)
