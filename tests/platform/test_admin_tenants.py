"""Tenants through the admin API: happy paths and every refusal, with OpenAI-style error bodies."""

from __future__ import annotations

import pytest
from platform_helpers import admin_headers, assert_error, engine_tenant

H = admin_headers()


def test_create_get_list_patch_delete(client):
    r = client.post("/admin/v1/tenants", json={"name": "acme", "priority": 1, "weight": 2.5}, headers=H)
    assert r.status_code == 201
    t = r.json()
    assert t["id"].startswith("ten_") and t["name"] == "acme" and t["priority"] == 1 and t["weight"] == 2.5
    assert t["status"] == "active"
    assert client.get(f"/admin/v1/tenants/{t['id']}", headers=H).json() == t
    client.post("/admin/v1/tenants", json={"name": "beta"}, headers=H)
    listing = client.get("/admin/v1/tenants", headers=H).json()
    assert listing["total"] == 2 and [x["name"] for x in listing["data"]] == ["acme", "beta"]
    assert len(client.get("/admin/v1/tenants?limit=1&offset=1", headers=H).json()["data"]) == 1

    r = client.patch(f"/admin/v1/tenants/{t['id']}", json={"status": "suspended", "weight": 4}, headers=H)
    assert r.status_code == 200 and r.json()["status"] == "suspended" and r.json()["weight"] == 4
    assert r.json()["priority"] == 1  # untouched

    r = client.delete(f"/admin/v1/tenants/{t['id']}", headers=H)
    assert r.json() == {"id": t["id"], "object": "tenant", "deleted": True}
    assert_error(client.get(f"/admin/v1/tenants/{t['id']}", headers=H), 404, param="tenant_id")


def test_auth_401_and_403(client):
    assert_error(client.get("/admin/v1/tenants"), 401, contains="missing")
    assert_error(client.get("/admin/v1/tenants", headers={"Authorization": "Basic abc"}), 401)
    assert_error(client.get("/admin/v1/tenants", headers=admin_headers("lpx-nope")), 401, contains="invalid")
    t = client.post("/admin/v1/tenants", json={"name": "acme"}, headers=H).json()
    key = client.post(f"/admin/v1/tenants/{t['id']}/keys", json={}, headers=H).json()["key"]
    err = assert_error(client.get("/admin/v1/tenants", headers=admin_headers(key)), 403, contains="tenant API key")
    assert err["type"] == "permission_error"
    for method, path in [
        ("post", "/admin/v1/tenants"),
        ("patch", f"/admin/v1/tenants/{t['id']}"),
        ("delete", f"/admin/v1/tenants/{t['id']}"),
    ]:
        assert client.request(method, path, json={}, headers=admin_headers(key)).status_code == 403


def test_conflicts_and_validation(client):
    a = client.post("/admin/v1/tenants", json={"name": "acme"}, headers=H).json()
    b = client.post("/admin/v1/tenants", json={"name": "beta"}, headers=H).json()
    assert_error(client.post("/admin/v1/tenants", json={"name": "acme"}, headers=H), 409, param="name")
    assert_error(client.patch(f"/admin/v1/tenants/{b['id']}", json={"name": "acme"}, headers=H), 409)
    # 422: wrong values; 400: not JSON / not an object
    assert_error(client.post("/admin/v1/tenants", json={"name": ""}, headers=H), 422, param="name")
    assert_error(client.post("/admin/v1/tenants", json={"name": "x y"}, headers=H), 422, param="name")
    assert_error(client.post("/admin/v1/tenants", json={"name": "ok", "weight": 0}, headers=H), 422, param="weight")
    assert_error(client.post("/admin/v1/tenants", json={"name": "ok", "priority": -1}, headers=H), 422)
    assert_error(client.post("/admin/v1/tenants", json={"name": "ok", "status": "gone"}, headers=H), 422)
    assert_error(client.post("/admin/v1/tenants", json={"name": "ok", "bogus": 1}, headers=H), 422, param="bogus")
    assert_error(
        client.post("/admin/v1/tenants", content=b"{nope", headers={**H, "content-type": "application/json"}), 400
    )
    assert_error(client.post("/admin/v1/tenants", json=[1, 2], headers=H), 400)
    assert_error(client.patch(f"/admin/v1/tenants/{a['id']}", json={"weight": None}, headers=H), 422)
    assert_error(client.patch(f"/admin/v1/tenants/{a['id']}", json={"status": "deleted"}, headers=H), 422)
    assert_error(client.get("/admin/v1/tenants?limit=0", headers=H), 422, param="limit")
    assert_error(client.patch("/admin/v1/tenants/ten_missing", json={"weight": 2}, headers=H), 404)
    assert_error(client.delete("/admin/v1/tenants/ten_missing", headers=H), 404)
    assert_error(client.get("/admin/v1/nowhere", headers=H), 404)


def test_changes_reach_the_engine(platform, client):
    t = client.post("/admin/v1/tenants", json={"name": "acme", "priority": 2, "weight": 3}, headers=H).json()
    client.put(f"/admin/v1/tenants/{t['id']}/quota", json={"max_concurrent": 5}, headers=H)
    client.patch(f"/admin/v1/tenants/{t['id']}", json={"weight": 7}, headers=H)
    engine = platform.ctx.engine.engine.engine
    tenant_state = engine_tenant(engine, t["id"])
    assert tenant_state == {"priority": 2, "weight": 7.0, "max_running_seqs": 5}


@pytest.mark.parametrize(
    "path", ["/admin/v1/tenants", "/admin/v1/adapters", "/admin/v1/usage", "/admin/v1/audit", "/admin/v1/engine"]
)
def test_every_list_endpoint_needs_admin(client, path):
    assert_error(client.get(path), 401)
