"""Adapters through the admin API: upload, versions, grants, listing, deletion, engine registration."""

from __future__ import annotations

from platform_helpers import (
    adapter_files,
    admin_headers,
    assert_error,
    models_of,
    targz_bytes,
    tenant,
    tenant_key,
    upload,
    zip_bytes,
)
from sqlalchemy import func, select

from loraplex.platform.adapters.models import Adapter

H = admin_headers()


def test_upload_private_then_serve(platform, client, good_files):
    acme = tenant(client, "acme")
    r = upload(
        client,
        "support-bot",
        zip_bytes({f"support-bot/{k}": v for k, v in good_files.items()}),
        visibility="private",
        tenant_id=acme,
    )
    assert r.status_code == 201, r.text
    a = r.json()
    assert a["id"].startswith("ada_") and a["version"] == 1 and a["status"] == "active"
    assert a["rank"] == 4 and a["alpha"] == 8 and a["target_modules"] == ["q_proj", "v_proj"]
    assert a["owner_tenant_id"] == acme and a["visibility"] == "private" and len(a["sha256"]) == 64
    # stored by content, registered with the running engine under the version's id
    stored = platform.store_root / a["sha256"][:2] / a["sha256"]
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in stored.iterdir()}
    assert a["id"] in platform.ctx.engine.engine.list_adapters()
    assert client.get(f"/admin/v1/adapters/{a['id']}", headers=H).json() == a
    assert [x["id"] for x in client.get("/admin/v1/adapters", headers=H).json()["data"]] == [a["id"]]
    assert "support-bot" in models_of(client, tenant_key(client, acme))
    other = tenant(client, "other")
    assert "support-bot" not in models_of(client, tenant_key(client, other))


def test_shared_adapter_from_tar_gz(client, good_files):
    r = upload(client, "shared-one", targz_bytes(good_files), filename="a.tar.gz", visibility="shared")
    assert r.status_code == 201, r.text
    assert r.json()["owner_tenant_id"] is None
    t = tenant(client, "anyone")
    assert "shared-one" in models_of(client, tenant_key(client, t))
    listed = client.get(f"/admin/v1/adapters?tenant_id={t}", headers=H).json()["data"]
    assert [x["name"] for x in listed] == ["shared-one"]


def test_new_version_is_explicit_and_never_reuses_the_old_key(platform, client, good_files, adapter_dirs):
    acme = tenant(client, "acme")
    v1 = upload(client, "bot", zip_bytes(good_files), tenant_id=acme).json()
    again = upload(client, "bot", zip_bytes(good_files), tenant_id=acme)
    assert_error(again, 409, param="name", contains="new_version")
    v2 = upload(client, "bot", zip_bytes(adapter_files(adapter_dirs["good2"])), tenant_id=acme, new_version=True)
    assert v2.status_code == 201, v2.text
    v2 = v2.json()
    assert v2["version"] == 2 and v2["id"] != v1["id"] and v2["sha256"] != v1["sha256"] and v2["rank"] == 8
    engine_adapters = platform.ctx.engine.engine.list_adapters()
    assert v2["id"] in engine_adapters and v1["id"] not in engine_adapters
    assert client.get(f"/admin/v1/adapters/{v1['id']}", headers=H).json()["status"] == "superseded"
    names = [x["id"] for x in client.get("/admin/v1/adapters?include_superseded=true", headers=H).json()["data"]]
    assert names == [v1["id"], v2["id"]]
    assert [x["id"] for x in client.get("/admin/v1/adapters", headers=H).json()["data"]] == [v2["id"]]
    assert_error(upload(client, "never-seen", zip_bytes(good_files), tenant_id=acme, new_version=True), 404)
    other = tenant(client, "other")
    assert_error(upload(client, "bot", zip_bytes(good_files), tenant_id=other, new_version=True), 409, contains="owner")


def test_same_content_is_stored_once_and_kept_while_referenced(platform, client, good_files):
    acme = tenant(client, "acme")
    a = upload(client, "one", zip_bytes(good_files), tenant_id=acme).json()
    b = upload(client, "two", targz_bytes(good_files), tenant_id=acme).json()
    assert a["sha256"] == b["sha256"]
    assert len(platform.ctx.store.stored_paths()) == 1
    assert client.delete(f"/admin/v1/adapters/{a['id']}", headers=H).json()["deleted"] is True
    assert len(platform.ctx.store.stored_paths()) == 1  # still used by "two"
    client.delete(f"/admin/v1/adapters/{b['id']}", headers=H)
    assert platform.ctx.store.stored_paths() == []
    assert b["id"] not in platform.ctx.engine.engine.list_adapters()
    assert_error(client.get(f"/admin/v1/adapters/{a['id']}", headers=H), 404)
    assert_error(client.delete(f"/admin/v1/adapters/{a['id']}", headers=H), 404)


def test_grants(client, good_files):
    acme, beta = tenant(client, "acme"), tenant(client, "beta")
    beta_key = tenant_key(client, beta)
    a = upload(client, "private-bot", zip_bytes(good_files), tenant_id=acme).json()
    assert "private-bot" not in models_of(client, beta_key)
    r = client.post(f"/admin/v1/adapters/{a['id']}/grants", json={"tenant_id": beta}, headers=H)
    assert r.status_code == 201 and r.json()["tenant_id"] == beta
    assert "private-bot" in models_of(client, beta_key)
    assert client.get(f"/admin/v1/adapters/{a['id']}", headers=H).json()["granted_tenant_ids"] == [beta]
    assert_error(client.post(f"/admin/v1/adapters/{a['id']}/grants", json={"tenant_id": beta}, headers=H), 409)
    assert_error(client.post(f"/admin/v1/adapters/{a['id']}/grants", json={"tenant_id": acme}, headers=H), 400)
    assert_error(client.post(f"/admin/v1/adapters/{a['id']}/grants", json={"tenant_id": "ten_x"}, headers=H), 404)
    assert_error(client.post("/admin/v1/adapters/ada_x/grants", json={"tenant_id": beta}, headers=H), 404)
    assert_error(client.post(f"/admin/v1/adapters/{a['id']}/grants", json={}, headers=H), 422)
    assert_error(
        client.post(f"/admin/v1/adapters/{a['id']}/grants", json={"tenant_id": beta}, headers=admin_headers(beta_key)),
        403,
    )
    # a new version keeps the grants
    v2 = upload(client, "private-bot", zip_bytes(good_files), tenant_id=acme, new_version=True).json()
    assert v2["granted_tenant_ids"] == [beta]
    r = client.delete(f"/admin/v1/adapters/{v2['id']}/grants?tenant_id={beta}", headers=H)
    assert r.status_code == 200
    assert "private-bot" not in models_of(client, beta_key)
    assert_error(client.delete(f"/admin/v1/adapters/{v2['id']}/grants?tenant_id={beta}", headers=H), 404)
    shared = upload(client, "everyone", zip_bytes(good_files), visibility="shared").json()
    assert_error(client.post(f"/admin/v1/adapters/{shared['id']}/grants", json={"tenant_id": beta}, headers=H), 400)


def test_deleting_a_tenant_removes_its_adapters(platform, client, good_files):
    acme = tenant(client, "acme")
    a = upload(client, "bot", zip_bytes(good_files), tenant_id=acme).json()
    client.delete(f"/admin/v1/tenants/{acme}", headers=H)
    assert_error(client.get(f"/admin/v1/adapters/{a['id']}", headers=H), 404)
    assert platform.ctx.store.stored_paths() == []
    assert a["id"] not in platform.ctx.engine.engine.list_adapters()


def test_upload_form_errors(platform, client, good_files):
    acme = tenant(client, "acme")
    data = zip_bytes(good_files)
    assert_error(upload(client, "x", data, tenant_id=acme, headers={}), 401)
    key = tenant_key(client, acme)
    assert_error(upload(client, "x", data, tenant_id=acme, headers=admin_headers(key)), 403)
    assert_error(upload(client, "bad name!", data, tenant_id=acme), 400, param="name")
    assert_error(upload(client, "x", data), 400, param="tenant_id")  # private without owner
    assert_error(upload(client, "x", data, visibility="shared", tenant_id=acme), 400, param="tenant_id")
    assert_error(upload(client, "x", data, visibility="public", tenant_id=acme), 400, param="visibility")
    assert_error(upload(client, "x", data, tenant_id="ten_missing"), 404)
    assert_error(upload(client, platform.ctx.engine.model_name, data, tenant_id=acme), 409)
    r = client.post("/admin/v1/adapters", data={"tenant_id": acme}, files={"file": ("a.zip", data)}, headers=H)
    assert_error(r, 422, param="name")
    assert_error(client.post("/admin/v1/adapters", data={"name": "x", "tenant_id": acme}, headers=H), 422)
    assert_error(upload(client, "x", data, tenant_id=acme, new_version="maybe"), 422)
    with platform.ctx.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Adapter)) == 0
