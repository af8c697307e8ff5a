"""`loraplex admin register-adapter NAME URI`: the same registration as the admin API's JSON body."""

from __future__ import annotations

import json

from platform_helpers import run_cli

from loraplex.platform.adapters.models import Adapter
from loraplex.platform.db.session import make_db_engine, make_session_factory


def test_register_adapter_by_uri(tmp_path, cli_env, adapter_dirs):
    assert run_cli("admin", "create-tenant", "acme", *cli_env).exit_code == 0
    source = f"file://{adapter_dirs['good']}"
    r = run_cli("admin", "register-adapter", "bot", source, "--tenant", "acme", *cli_env)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["source_uri"] == source and out["rank"] == 4 and len(out["sha256"]) == 64
    engine = make_db_engine(f"sqlite:///{tmp_path / 'data' / 'loraplex.db'}")
    with make_session_factory(engine)() as s:
        row = s.get(Adapter, out["id"])
        assert row is not None and row.source_uri == source and row.storage_path == ""
    engine.dispose()
    # errors are one clear line: a wrong base model, a bad URI, a missing folder
    r = run_cli("admin", "register-adapter", "other", f"file://{adapter_dirs['wrong_base']}", "--shared", *cli_env)
    assert r.exit_code == 1 and "error:" in r.output
    r = run_cli("admin", "register-adapter", "other", "ftp://x/y", "--shared", *cli_env)
    assert r.exit_code == 1 and "unsupported source" in r.output
    r = run_cli("admin", "register-adapter", "other", f"file://{tmp_path}/no/such/folder", "--shared", *cli_env)
    assert r.exit_code == 1 and "does not exist" in r.output
    r = run_cli("admin", "register-adapter", "other", "file:///etc", "--shared", *cli_env)
    assert r.exit_code == 1 and "outside the allowed folders" in r.output
