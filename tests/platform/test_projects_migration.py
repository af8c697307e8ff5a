"""Migration 0014 (projects, api_keys.project_id, usage_records.project_id) on a database holding
tenants, keys and usage records, SQLite and PostgreSQL: upgraded from 0012 with rows in place,
every row keeps its values and has no project; a project and a key of it go in, a key naming a
missing project is refused (the foreign key), two projects of one name in one tenant are refused;
downgrade and upgrade again keep the rows."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from platform_helpers import BACKENDS, need_postgres, pg_create_database, pg_drop_database
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from loraplex.platform.db import migrate
from loraplex.platform.db.session import make_db_engine


@pytest.fixture(params=BACKENDS)
def empty_db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    need_postgres()
    url = pg_create_database()
    yield url
    pg_drop_database(url)


def _snapshot(engine) -> dict:
    with engine.connect() as conn:
        keys = conn.execute(text("SELECT id, tenant_id, name, rpm FROM api_keys ORDER BY id")).all()
        usage = conn.execute(text("SELECT request_id, tenant_id, api_key_id, prompt_tokens FROM usage_records")).all()
    return {"keys": [tuple(r) for r in keys], "usage": sorted(tuple(r) for r in usage)}


def test_upgrade_from_0012_keeps_keys_and_usage_and_adds_projects(empty_db_url):
    migrate.upgrade(empty_db_url, "0012")
    now = datetime(2026, 12, 6, tzinfo=timezone.utc).replace(tzinfo=None)
    engine = make_db_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tenants (id, name, priority, weight, status, created_at, updated_at)"
                    " VALUES ('ten_a', 'a', 0, 1.0, 'active', :now, :now)"
                ),
                {"now": now},
            )
            for kid, rpm in (("key_1", None), ("key_2", 5)):
                conn.execute(
                    text(
                        "INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash, created_at, rpm)"
                        " VALUES (:id, 'ten_a', 'k', 'lpx-', :h, :now, :rpm)"
                    ),
                    {"id": kid, "h": "h" + kid, "now": now, "rpm": rpm},
                )
            conn.execute(
                text(
                    "INSERT INTO usage_records (request_id, tenant_id, api_key_id, endpoint, prompt_tokens,"
                    " completion_tokens, status, instance_id, created_at, updated_at, reserved_tokens,"
                    " cached_tokens) VALUES ('r1', 'ten_a', 'key_1', 'completions', 7, 3, 'ok', 'i', :now, :now, 0, 0)"
                ),
                {"now": now},
            )
        before = _snapshot(engine)
        migrate.upgrade(empty_db_url)
        assert _snapshot(engine) == before
        with engine.begin() as conn:
            assert conn.execute(text("SELECT project_id FROM api_keys")).scalars().all() == [None, None]
            assert conn.execute(text("SELECT project_id FROM usage_records")).scalars().all() == [None]
            conn.execute(
                text(
                    "INSERT INTO projects (id, tenant_id, name, priority, weight, created_at, updated_at, allowed_models)"
                    " VALUES ('prj_1', 'ten_a', 'team', 0, 3.0, :now, :now, :models)"
                ),
                {"now": now, "models": '["alpha"]'},
            )
            conn.execute(text("UPDATE api_keys SET project_id = 'prj_1' WHERE id = 'key_2'"))
        with pytest.raises(IntegrityError), engine.begin() as conn:  # make_db_engine: foreign keys on
            conn.execute(text("UPDATE api_keys SET project_id = 'prj_missing' WHERE id = 'key_1'"))
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO projects (id, tenant_id, name, priority, weight, created_at, updated_at)"
                    " VALUES ('prj_2', 'ten_a', 'team', 0, 1.0, :now, :now)"
                ),
                {"now": now},
            )
        assert {c["name"] for c in inspect(engine).get_columns("api_keys")} >= {"project_id"}
        migrate.downgrade(empty_db_url, "0012")
        assert "projects" not in inspect(engine).get_table_names()
        assert "project_id" not in {c["name"] for c in inspect(engine).get_columns("api_keys")}
        assert "project_id" not in {c["name"] for c in inspect(engine).get_columns("usage_records")}
        assert _snapshot(engine) == before
        migrate.upgrade(empty_db_url)
        assert _snapshot(engine) == before
    finally:
        engine.dispose()
