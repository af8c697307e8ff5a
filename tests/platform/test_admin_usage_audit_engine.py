"""Usage reports, the audit log and the live engine view."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from platform_helpers import admin_headers, assert_error, tenant, tenant_key, upload, zip_bytes

from loraplex.platform.db.session import unit_of_work
from loraplex.platform.usage.models import UsageRecord

H = admin_headers()
T0 = datetime(2026, 3, 1, 10, 15, tzinfo=timezone.utc)


def _seed(platform, acme, beta):
    rows = [
        (acme, None, T0, 10, 5, "ok"),
        (acme, "bot", T0 + timedelta(minutes=20), 7, 3, "ok"),
        (acme, "bot", T0 + timedelta(hours=1), 1, 0, "error"),
        (acme, None, T0 + timedelta(days=1), 100, 50, "ok"),
        (beta, None, T0, 4, 4, "ok"),
    ]
    with unit_of_work(platform.ctx.sessions) as s:
        s.add_all(
            [
                UsageRecord(
                    request_id=f"seed-{i}",
                    tenant_id=t,
                    adapter_name=a,
                    created_at=at,
                    prompt_tokens=p,
                    completion_tokens=c,
                    status=st,
                )
                for i, (t, a, at, p, c, st) in enumerate(rows)
            ]
        )


def test_usage_grouped_by_hour_day_adapter(platform, client):
    acme, beta = tenant(client, "acme"), tenant(client, "beta")
    _seed(platform, acme, beta)
    hour = client.get(f"/admin/v1/usage?tenant_id={acme}&group_by=hour", headers=H).json()
    assert [
        (b["key"], b["requests"], b["errors"], b["prompt_tokens"], b["completion_tokens"]) for b in hour["data"]
    ] == [
        ("2026-03-01T10:00:00Z", 2, 0, 17, 8),
        ("2026-03-01T11:00:00Z", 1, 1, 1, 0),
        ("2026-03-02T10:00:00Z", 1, 0, 100, 50),
    ]
    assert hour["totals"]["requests"] == 4 and hour["totals"]["total_tokens"] == 176
    day = client.get(f"/admin/v1/usage?tenant_id={acme}&group_by=day", headers=H).json()
    assert [(b["key"], b["requests"]) for b in day["data"]] == [
        ("2026-03-01T00:00:00Z", 3),
        ("2026-03-02T00:00:00Z", 1),
    ]
    by_adapter = client.get("/admin/v1/usage?group_by=adapter", headers=H).json()
    assert {b["key"]: b["requests"] for b in by_adapter["data"]} == {"": 3, "bot": 2}
    window = client.get(
        "/admin/v1/usage", params={"since": "2026-03-01T11:00:00+00:00", "until": "2026-03-02T00:00:00Z"}, headers=H
    ).json()
    assert window["totals"]["requests"] == 1 and window["totals"]["errors"] == 1


def test_usage_errors(client):
    key = tenant_key(client, tenant(client, "acme"))
    assert_error(client.get("/admin/v1/usage?group_by=week", headers=H), 422, param="group_by")
    assert_error(client.get("/admin/v1/usage?since=yesterday", headers=H), 422, param="since")
    assert_error(client.get("/admin/v1/usage?since=2026-03-01T00:00:00", headers=H), 422)  # naive
    assert_error(
        client.get(
            "/admin/v1/usage", params={"since": "2026-03-02T00:00:00Z", "until": "2026-03-01T00:00:00Z"}, headers=H
        ),
        400,
        param="since",
    )
    assert_error(client.get("/admin/v1/usage?tenant_id=ten_missing", headers=H), 404)
    assert_error(client.get("/admin/v1/usage", headers=admin_headers(key)), 403)


def test_audit_log_records_who_what_when_before_after(client, good_files):
    acme = tenant(client, "acme")
    client.patch(f"/admin/v1/tenants/{acme}", json={"priority": 3}, headers=H)
    key = client.post(f"/admin/v1/tenants/{acme}/keys", json={"name": "k"}, headers=H).json()
    client.delete(f"/admin/v1/keys/{key['id']}", headers=H)
    ada = upload(client, "bot", zip_bytes(good_files), tenant_id=acme).json()
    client.delete(f"/admin/v1/adapters/{ada['id']}", headers=H)
    entries = client.get("/admin/v1/audit", headers=H).json()["data"]
    assert [e["action"] for e in entries] == [
        "adapter.delete",
        "adapter.create",
        "key.revoke",
        "key.create",
        "tenant.update",
        "tenant.create",
    ]
    assert all(e["actor"] == "admin" and e["created_at"] for e in entries)
    update = entries[4]
    assert update["before"]["priority"] == 0 and update["after"]["priority"] == 3
    assert entries[2]["before"]["revoked_at"] is None and entries[2]["after"]["revoked_at"]
    assert [e["action"] for e in client.get(f"/admin/v1/audit?target_id={acme}", headers=H).json()["data"]] == [
        "tenant.update",
        "tenant.create",
    ]
    assert len(client.get("/admin/v1/audit?limit=2", headers=H).json()["data"]) == 2
    assert_error(client.get("/admin/v1/audit?limit=0", headers=H), 422)


def test_engine_view(platform, client, good_files):
    acme = tenant(client, "acme")
    ada = upload(client, "bot", zip_bytes(good_files), tenant_id=acme).json()
    r = client.get("/admin/v1/engine", headers=H)
    assert r.status_code == 200
    state = r.json()
    assert state["enabled"] is True and state["model"] == platform.ctx.engine.model_name
    assert "scheduler" in state and "kv_cache" in state
    assert ada["id"] in state["registered_adapters"]
    key = tenant_key(client, acme)
    assert_error(client.get("/admin/v1/engine", headers=admin_headers(key)), 403)


def test_openapi_documents_the_admin_api(client):
    spec = client.get("/openapi.json").json()
    for path in [
        "/admin/v1/tenants",
        "/admin/v1/tenants/{tenant_id}",
        "/admin/v1/tenants/{tenant_id}/keys",
        "/admin/v1/keys/{key_id}",
        "/admin/v1/tenants/{tenant_id}/quota",
        "/admin/v1/adapters",
        "/admin/v1/adapters/{adapter_id}",
        "/admin/v1/adapters/{adapter_id}/grants",
        "/admin/v1/usage",
        "/admin/v1/engine",
        "/admin/v1/audit",
    ]:
        assert path in spec["paths"], path
