"""Migration 0009 (usage_records.http_request_id) on a database holding usage records, SQLite and
PostgreSQL: upgraded from 0008 with rows in place, every row keeps its values and has no request
id, the column takes a 128-character id and is indexed; downgrade and upgrade again keep the rows."""

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


def _rows(engine) -> dict[str, tuple]:
    with engine.connect() as conn:
        return {
            r[0]: tuple(r[1:])
            for r in conn.execute(
                text("SELECT request_id, tenant_id, prompt_tokens, completion_tokens, status FROM usage_records")
            )
        }


def test_upgrade_from_0008_keeps_usage_and_adds_an_indexed_request_id(empty_db_url):
    migrate.upgrade(empty_db_url, "0008")
    now = datetime(2026, 12, 5, tzinfo=timezone.utc).replace(tzinfo=None)
    before = {"r1": ("ten_a", 5, 7, "ok"), "r2": ("ten_b", 1, 0, "running")}
    engine = make_db_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            for rid, (tid, p, c, status) in before.items():
                conn.execute(
                    text(
                        "INSERT INTO usage_records (request_id, tenant_id, endpoint, prompt_tokens, completion_tokens,"
                        " status, instance_id, created_at, updated_at, reserved_tokens)"
                        " VALUES (:rid, :tid, 'chat.completions', :p, :c, :status, 'i', :now, :now, 0)"
                    ),
                    {"rid": rid, "tid": tid, "p": p, "c": c, "status": status, "now": now},
                )
        migrate.upgrade(empty_db_url)
        assert _rows(engine) == before
        with engine.begin() as conn:
            assert conn.execute(text("SELECT http_request_id FROM usage_records")).scalars().all() == [None, None]
            long_id = "req_" + "x" * 124  # the longest id the middleware accepts from a client (128)
            conn.execute(text("UPDATE usage_records SET http_request_id = :h WHERE request_id = 'r1'"), {"h": long_id})
            found = conn.execute(
                text("SELECT request_id FROM usage_records WHERE http_request_id = :h"), {"h": long_id}
            ).scalars()
            assert found.all() == ["r1"]
        indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("usage_records")}
        assert indexes.get("ix_usage_records_http_request_id") == ["http_request_id"]
        migrate.downgrade(empty_db_url, "0008")
        assert "http_request_id" not in {c["name"] for c in inspect(engine).get_columns("usage_records")}
        assert _rows(engine) == before
        migrate.upgrade(empty_db_url)
        assert _rows(engine) == before
    finally:
        engine.dispose()
