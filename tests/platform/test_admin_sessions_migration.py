"""Migration 0011 (admin_sessions, audit_log.actor widened to 255) on a database holding data,
SQLite and PostgreSQL: upgraded from 0010 with audit entries in place, every entry keeps its values,
an "sso:<long email>" actor fits, sessions can be stored; downgrade and upgrade again keep the rows."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from platform_helpers import BACKENDS, need_postgres, pg_create_database, pg_drop_database
from sqlalchemy import inspect, text

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


def _audit(engine) -> dict[str, tuple]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT target_id, actor, action, target_type FROM audit_log"))
        return {r[0]: tuple(r[1:]) for r in rows}


def test_upgrade_from_0010_keeps_the_audit_log_and_adds_sessions(empty_db_url):
    migrate.upgrade(empty_db_url, "0010")
    now = datetime(2026, 12, 6, tzinfo=timezone.utc).replace(tzinfo=None)
    before = {"ten_a": ("admin", "tenant.create", "tenant"), "key_b": ("admin:lpx-admin-ab", "key.create", "api_key")}
    engine = make_db_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            for target, (actor, action, ttype) in before.items():
                conn.execute(
                    text(
                        "INSERT INTO audit_log (created_at, actor, action, target_type, target_id)"
                        " VALUES (:now, :actor, :action, :ttype, :target)"
                    ),
                    {"now": now, "actor": actor, "action": action, "ttype": ttype, "target": target},
                )
        migrate.upgrade(empty_db_url)
        assert _audit(engine) == before
        long_actor = "sso:" + "a" * 200 + "@example.com"  # over the old 64 characters
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO audit_log (created_at, actor, action, target_type, target_id)"
                    " VALUES (:now, :actor, 'sso.login', 'admin_session', 'h1')"
                ),
                {"now": now, "actor": long_actor},
            )
            conn.execute(
                text(
                    "INSERT INTO admin_sessions (token_hash, subject, email, roles, created_at, expires_at)"
                    " VALUES (:h, 'sub-1', 'a@example.com', :roles, :now, :now)"
                ),
                {"h": "f" * 64, "roles": '["viewer"]', "now": now},
            )
            assert conn.execute(text("SELECT actor FROM audit_log WHERE target_id = 'h1'")).scalar() == long_actor
        actor = next(c for c in inspect(engine).get_columns("audit_log") if c["name"] == "actor")
        assert actor["type"].length == 255
        indexes = {i["name"] for i in inspect(engine).get_indexes("admin_sessions")}
        assert {"ix_admin_sessions_email", "ix_admin_sessions_expires_at"} <= indexes
        with engine.begin() as conn:  # the long actor would not fit the narrower column again
            conn.execute(text("DELETE FROM audit_log WHERE target_id = 'h1'"))
        migrate.downgrade(empty_db_url, "0010")
        assert "admin_sessions" not in inspect(engine).get_table_names()
        assert _audit(engine) == before
        migrate.upgrade(empty_db_url)
        assert _audit(engine) == before
    finally:
        engine.dispose()
