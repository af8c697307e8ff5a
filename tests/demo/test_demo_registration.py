"""What `loraplex serve` (demo mode) and `loraplex demo adapters` do to the database: one demo
tenant and key, created once; the demo adapters registered as the demo tenant's private adapters,
validated against the real base model, a new version on re-registration."""

from __future__ import annotations

from loraplex.platform.adapters import repository as adapters_repo
from loraplex.platform.context import PlatformContext
from loraplex.platform.db import migrate
from loraplex.platform.db.session import unit_of_work
from loraplex.platform.demo.adapters import register_for_demo_tenant
from loraplex.platform.demo.bootstrap import DEMO_TENANT, ensure_demo_tenant
from loraplex.platform.engine_client import LocalEngineClient
from loraplex.platform.keys import repository as keys_repo
from loraplex.platform.settings import load_settings
from loraplex.platform.tenants import repository as tenants_repo


def test_demo_tenant_once_and_adapters_registered_for_it(tmp_path, smollm2_dir, demo_adapter_dirs):
    settings = load_settings(data_dir=tmp_path / "data", engine={"model": str(smollm2_dir)})
    migrate.upgrade(settings.db_url)
    ctx = PlatformContext.build(settings, LocalEngineClient.validator_only(settings))
    try:
        key = ensure_demo_tenant(ctx)
        assert key and key.startswith("lpx-")
        assert ensure_demo_tenant(ctx) is None  # the key is shown once; a restart creates nothing
        with ctx.sessions() as session:
            tenant = tenants_repo.get_by_name(session, DEMO_TENANT)
            stored = keys_repo.get_by_hash(session, ctx.hasher.hash(key))
            assert stored is not None and stored.tenant_id == tenant.id
            assert len(keys_repo.list_for_tenant(session, tenant.id)) == 1
        first = register_for_demo_tenant(ctx, demo_adapter_dirs)
        assert sorted(r["name"] for r in first) == ["french", "pirate", "tools"]
        assert {r["version"] for r in first} == {1} and {r["rank"] for r in first} == {8}
        again = register_for_demo_tenant(ctx, demo_adapter_dirs)
        assert {r["version"] for r in again} == {2}
        with unit_of_work(ctx.sessions) as session:
            owned = adapters_repo.owned_by(session, tenant.id)
            assert sorted((a.name, a.version, a.status) for a in owned) == [
                ("french", 1, "superseded"),
                ("french", 2, "active"),
                ("pirate", 1, "superseded"),
                ("pirate", 2, "active"),
                ("tools", 1, "superseded"),
                ("tools", 2, "active"),
            ]
    finally:
        ctx.close()
