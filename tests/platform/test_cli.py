"""The `loraplex` CLI: db upgrade and the admin helpers call the same services as the API."""

from __future__ import annotations

import json

from platform_helpers import run_cli, zip_bytes
from sqlalchemy import select

from loraplex.platform.adapters.models import Adapter
from loraplex.platform.audit.models import AuditEntry
from loraplex.platform.db.session import make_db_engine, make_session_factory


def test_db_upgrade_and_admin_helpers(tmp_path, cli_env, good_files):
    r = run_cli("db", "upgrade", *cli_env)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "data" / "loraplex.db").exists()
    r = run_cli("admin", "create-tenant", "acme", "--priority", "1", "--weight", "2", *cli_env)
    assert r.exit_code == 0, r.output
    tenant = json.loads(r.output)
    assert tenant["name"] == "acme" and tenant["priority"] == 1
    r = run_cli("admin", "create-key", "acme", "--name", "ci", *cli_env)
    assert r.exit_code == 0, r.output
    key = json.loads(r.output)
    assert key["key"].startswith("lpx-") and key["tenant_id"] == tenant["id"]
    archive = tmp_path / "bot.zip"
    archive.write_bytes(zip_bytes(good_files))
    r = run_cli("admin", "upload-adapter", "bot", str(archive), "--tenant", "acme", *cli_env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["rank"] == 4
    engine = make_db_engine(f"sqlite:///{tmp_path / 'data' / 'loraplex.db'}")
    with make_session_factory(engine)() as s:
        assert s.scalar(select(Adapter.name)) == "bot"
        actions = {(e.actor, e.action) for e in s.scalars(select(AuditEntry))}
    engine.dispose()
    assert actions == {("cli", "tenant.create"), ("cli", "key.create"), ("cli", "adapter.create")}


def test_cli_errors_are_one_clear_line(tmp_path, cli_env, good_files):
    run_cli("admin", "create-tenant", "acme", *cli_env)
    r = run_cli("admin", "create-tenant", "acme", *cli_env)
    assert r.exit_code == 1 and "already exists" in r.output
    r = run_cli("admin", "create-tenant", "bad name", *cli_env)
    assert r.exit_code == 2 and "name" in r.output
    r = run_cli("admin", "create-key", "nobody", *cli_env)
    assert r.exit_code == 1 and "no tenant" in r.output
    bad = tmp_path / "bad.zip"
    bad.write_bytes(zip_bytes({**good_files, "../evil": b"x"}))
    r = run_cli("admin", "upload-adapter", "bot", str(bad), "--tenant", "acme", *cli_env)
    assert r.exit_code == 1 and ".." in r.output
    r = run_cli("db", "upgrade", "--config", str(tmp_path / "missing.toml"))
    assert r.exit_code == 2 and "not found" in r.output
