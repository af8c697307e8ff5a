"""Migration 0010 (the price book, usage_records.cached_tokens and base_model) on a database holding
usage records, SQLite and PostgreSQL: upgraded from 0009 with rows in place, every row keeps its
values, has no cached tokens (0) and no base model (NULL); a price row goes in; downgrade and
upgrade again keep the records."""

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
        sql = "SELECT request_id, tenant_id, adapter_name, prompt_tokens, completion_tokens, status FROM usage_records"
        return {r[0]: tuple(r[1:]) for r in conn.execute(text(sql))}


def test_upgrade_from_0009_keeps_usage_and_adds_prices_and_cost_columns(empty_db_url):
    migrate.upgrade(empty_db_url, "0009")
    now = datetime(2026, 12, 5, tzinfo=timezone.utc).replace(tzinfo=None)
    before = {"r1": ("ten_a", "bot", 5, 7, "ok"), "r2": ("ten_b", None, 1, 0, "running")}
    engine = make_db_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            for rid, (tid, adapter, p, c, status) in before.items():
                conn.execute(
                    text(
                        "INSERT INTO usage_records (request_id, tenant_id, adapter_name, endpoint, prompt_tokens,"
                        " completion_tokens, status, instance_id, created_at, updated_at, reserved_tokens)"
                        " VALUES (:rid, :tid, :a, 'chat.completions', :p, :c, :status, 'i', :now, :now, 0)"
                    ),
                    {"rid": rid, "tid": tid, "a": adapter, "p": p, "c": c, "status": status, "now": now},
                )
        migrate.upgrade(empty_db_url)
        assert _rows(engine) == before
        with engine.begin() as conn:
            got = conn.execute(text("SELECT cached_tokens, base_model FROM usage_records ORDER BY request_id"))
            assert [tuple(r) for r in got] == [(0, None), (0, None)]
            conn.execute(
                text(
                    "INSERT INTO prices (id, model, currency, input_micros_per_mtok, cached_input_micros_per_mtok,"
                    " output_micros_per_mtok, effective_from, created_by, created_at)"
                    " VALUES ('prc_1', '*', 'USD', 150000, 75000, 600000000000, :now, 'test', :now)"
                ),
                {"now": now},
            )
            big = conn.execute(text("SELECT output_micros_per_mtok FROM prices")).scalar_one()
            assert big == 600_000_000_000  # a BIGINT: rates up to a million per million tokens
        assert {c["name"] for c in inspect(engine).get_columns("usage_records")} >= {"cached_tokens", "base_model"}
        migrate.downgrade(empty_db_url, "0009")
        assert "prices" not in inspect(engine).get_table_names()
        assert "cached_tokens" not in {c["name"] for c in inspect(engine).get_columns("usage_records")}
        assert _rows(engine) == before
        migrate.upgrade(empty_db_url)
        assert _rows(engine) == before
    finally:
        engine.dispose()
