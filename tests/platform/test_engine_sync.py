"""What the database says reaches the engine at start: tenants' scheduling fields and adapters."""

from __future__ import annotations

from platform_helpers import admin_headers, engine_tenant, make_settings, tenant, upload, zip_bytes

from loraplex.platform.app import build_context

H = admin_headers()


def test_restart_restores_engine_state_from_the_database(platform, client, good_files, tmp_path, db_url):
    acme = tenant(client, "acme")
    client.patch(f"/admin/v1/tenants/{acme}", json={"priority": 4, "weight": 9}, headers=H)
    ada = upload(client, "bot", zip_bytes(good_files), tenant_id=acme).json()
    gw = platform.ctx.engine
    # Simulate a fresh engine: forget the adapter and the tenant's fields.
    gw.remove_adapter(ada["id"])
    gw.set_tenant(acme, 0, 1.0, None)
    assert ada["id"] not in gw.engine.list_adapters()
    ctx, new_key = build_context(make_settings(tmp_path, db_url), gw, upgrade_db=False)
    try:
        assert new_key is None  # an admin key is configured
        assert ada["id"] in gw.engine.list_adapters()
        assert engine_tenant(gw.engine.engine, acme)["priority"] == 4
        assert engine_tenant(gw.engine.engine, acme)["weight"] == 9.0
    finally:
        ctx.close()
