"""Alembic owns the schema: upgrade head on empty databases, downgrade cleanly, and the migrations
agree with the models (autogenerate finds nothing to do)."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from platform_helpers import BACKENDS, need_postgres, pg_create_database, pg_drop_database
from sqlalchemy import create_engine, inspect, text

from loraplex.platform.db import migrate
from loraplex.platform.db.metadata import metadata
from loraplex.platform.db.session import make_db_engine

TABLES = {"tenants", "api_keys", "admin_keys", "adapters", "adapter_grants", "quotas", "usage_records", "audit_log"}


@pytest.fixture(params=BACKENDS)
def empty_db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'nested' / 'empty.db'}"
        return
    need_postgres()
    url = pg_create_database()
    yield url
    pg_drop_database(url)


def test_upgrade_head_on_an_empty_database(empty_db_url):
    migrate.upgrade(empty_db_url)
    engine = make_db_engine(empty_db_url)
    try:
        assert TABLES <= set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            version = conn.execute(text("select version_num from alembic_version")).scalar()
        assert version in migrate.current_heads()
        migrate.upgrade(empty_db_url)  # idempotent
    finally:
        engine.dispose()


def test_models_and_migrations_agree(empty_db_url):
    migrate.upgrade(empty_db_url)
    engine = create_engine(empty_db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, metadata)
        assert diff == [], f"models and migrations differ; write a migration: {diff}"
    finally:
        engine.dispose()


def test_downgrade_to_base_and_back(empty_db_url):
    migrate.upgrade(empty_db_url)
    migrate.downgrade(empty_db_url, "base")
    engine = make_db_engine(empty_db_url)
    try:
        assert not (TABLES & set(inspect(engine).get_table_names()))
    finally:
        engine.dispose()
    migrate.upgrade(empty_db_url)


def test_sqlite_is_wal_with_foreign_keys(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    migrate.upgrade(url)
    engine = make_db_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_script_location_does_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    migrate.upgrade(f"sqlite:///{tmp_path / 'cwd.db'}")
    assert (tmp_path / "cwd.db").exists()
