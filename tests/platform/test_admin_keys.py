"""API keys: shown once, stored only as prefix + HMAC, revocation effective at the next request."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from platform_helpers import admin_headers, assert_error
from sqlalchemy import select

from loraplex.platform.keys.models import ApiKey

H = admin_headers()


def _tenant(client, name="acme"):
    return client.post("/admin/v1/tenants", json={"name": name}, headers=H).json()["id"]


def test_key_shown_once_and_never_stored_in_clear(platform, client):
    tid = _tenant(client)
    r = client.post(f"/admin/v1/tenants/{tid}/keys", json={"name": "ci"}, headers=H)
    assert r.status_code == 201
    created = r.json()
    key = created["key"]
    assert key.startswith("lpx-") and len(key) > 40 and created["prefix"] == key[:12]
    listing = client.get(f"/admin/v1/tenants/{tid}/keys", headers=H)
    assert listing.status_code == 200
    assert key not in listing.text and "key" not in listing.json()["data"][0]
    assert listing.json()["data"][0]["name"] == "ci"
    with platform.ctx.sessions() as s:
        row = s.scalar(select(ApiKey))
        assert row.key_hash != key and key not in row.key_hash and len(row.key_hash) == 64
        assert row.key_hash == platform.ctx.hasher.hash(key)
    # Nowhere in the database: not in the key table, not in the audit log.
    audit = client.get("/admin/v1/audit", headers=H)
    assert key not in audit.text and "key_hash" not in audit.text
    with platform.ctx.db_engine.connect() as conn:
        for table in ("api_keys", "audit_log"):
            dump = repr(conn.exec_driver_sql(f"SELECT * FROM {table}").fetchall())
            assert key not in dump and key[12:] not in dump


def test_revocation_is_effective_on_the_next_request(client):
    tid = _tenant(client)
    created = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()
    tenant_h = admin_headers(created["key"])
    # Two requests: the second is served from the lookup cache.
    assert client.get("/v1/models", headers=tenant_h).status_code == 200
    assert client.get("/v1/models", headers=tenant_h).status_code == 200
    r = client.delete(f"/admin/v1/keys/{created['id']}", headers=H)
    assert r.status_code == 200 and r.json()["revoked_at"] is not None and "key" not in r.json()
    assert_error(client.get("/v1/models", headers=tenant_h), 401, contains="revoked")
    assert_error(client.delete(f"/admin/v1/keys/{created['id']}", headers=H), 409, contains="already revoked")
    assert_error(client.delete("/admin/v1/keys/key_missing", headers=H), 404)


def test_suspension_and_deletion_are_effective_on_the_next_request(client):
    tid = _tenant(client)
    key = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()["key"]
    assert client.get("/v1/models", headers=admin_headers(key)).status_code == 200
    client.patch(f"/admin/v1/tenants/{tid}", json={"status": "suspended"}, headers=H)
    assert_error(client.get("/v1/models", headers=admin_headers(key)), 403, contains="suspended")
    client.patch(f"/admin/v1/tenants/{tid}", json={"status": "active"}, headers=H)
    assert client.get("/v1/models", headers=admin_headers(key)).status_code == 200
    client.delete(f"/admin/v1/tenants/{tid}", headers=H)
    assert_error(client.get("/v1/models", headers=admin_headers(key)), 401)


def test_expiry(client):
    tid = _tenant(client)
    soon = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
    r = client.post(f"/admin/v1/tenants/{tid}/keys", json={"name": "tmp", "expires_at": soon}, headers=H)
    assert r.status_code == 201 and r.json()["expires_at"] is not None
    assert client.get("/v1/models", headers=admin_headers(r.json()["key"])).status_code == 200
    past = (datetime.now(timezone.utc) - timedelta(seconds=1)).isoformat()
    assert_error(
        client.post(f"/admin/v1/tenants/{tid}/keys", json={"expires_at": past}, headers=H), 400, param="expires_at"
    )
    assert_error(
        client.post(f"/admin/v1/tenants/{tid}/keys", json={"expires_at": "2030-01-01T00:00:00"}, headers=H), 422
    )  # no time zone


def test_key_errors(client):
    tid = _tenant(client)
    assert_error(client.post("/admin/v1/tenants/ten_missing/keys", json={}, headers=H), 404)
    assert_error(client.get("/admin/v1/tenants/ten_missing/keys", headers=H), 404)
    assert_error(client.post(f"/admin/v1/tenants/{tid}/keys", json={"name": "x" * 65}, headers=H), 422)
    assert_error(
        client.post(f"/admin/v1/tenants/{tid}/keys", content=b"[", headers={**H, "content-type": "application/json"}),
        400,
    )
    assert_error(client.post(f"/admin/v1/tenants/{tid}/keys", json={}), 401)
    key = client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=H).json()
    assert_error(client.post(f"/admin/v1/tenants/{tid}/keys", json={}, headers=admin_headers(key["key"])), 403)
    assert_error(client.delete(f"/admin/v1/keys/{key['id']}", headers=admin_headers(key["key"])), 403)
    assert_error(client.get(f"/admin/v1/tenants/{tid}/keys", headers=admin_headers(key["key"])), 403)
    assert_error(client.get("/v1/models", headers=H), 401)  # the admin key is not a tenant key
