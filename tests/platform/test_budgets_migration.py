"""Migration 0013 (budgets, budget_holds) on a database with data, SQLite and PostgreSQL: upgraded
from 0012 with tenants, keys, usage records and prices in place, every row keeps its values; a
budget and a hold go in (amounts past 2^32: BIGINT); downgrade and upgrade again keep the rest."""

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


def _snapshot(engine) -> dict:
    with engine.connect() as conn:
        return {
            "tenants": sorted(tuple(r) for r in conn.execute(text("SELECT id, name, status FROM tenants"))),
            "keys": sorted(tuple(r) for r in conn.execute(text("SELECT id, tenant_id, prefix FROM api_keys"))),
            "usage": sorted(
                tuple(r) for r in conn.execute(text("SELECT request_id, tenant_id, prompt_tokens FROM usage_records"))
            ),
            "prices": sorted(
                tuple(r) for r in conn.execute(text("SELECT id, model, output_micros_per_mtok FROM prices"))
            ),
        }


def test_upgrade_from_0012_with_data_then_down_and_up(empty_db_url):
    migrate.upgrade(empty_db_url, "0012")
    now = datetime(2026, 12, 6, tzinfo=timezone.utc).replace(tzinfo=None)
    engine = make_db_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tenants (id, name, priority, weight, status, created_at, updated_at)"
                    " VALUES ('ten_1', 'acme', 0, 1.0, 'active', :now, :now)"
                ),
                {"now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, tenant_id, name, prefix, key_hash, created_at)"
                    " VALUES ('key_1', 'ten_1', '', 'lpx-ab', 'h1', :now)"
                ),
                {"now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO usage_records (request_id, tenant_id, endpoint, prompt_tokens, completion_tokens,"
                    " status, instance_id, created_at, updated_at, reserved_tokens, cached_tokens)"
                    " VALUES ('r1', 'ten_1', 'completions', 5, 7, 'ok', 'i', :now, :now, 0, 0)"
                ),
                {"now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO prices (id, model, currency, input_micros_per_mtok, cached_input_micros_per_mtok,"
                    " output_micros_per_mtok, effective_from, created_by, created_at)"
                    " VALUES ('prc_1', '*', 'USD', 1, 1, 2, :now, 't', :now)"
                ),
                {"now": now},
            )
        before = _snapshot(engine)
        migrate.upgrade(empty_db_url)
        assert _snapshot(engine) == before
        big = 10**18  # a million dollars in units of 10^-12
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO budgets (scope, scope_id, tenant_id, amount_micros, currency, period, timezone,"
                    " window_start, spent_units, reserved_units, updated_by, created_at, updated_at)"
                    " VALUES ('tenant', 'ten_1', 'ten_1', 1000000000000, 'USD', 'monthly', 'Europe/Paris', :now,"
                    " :big, 0, 't', :now, :now)"
                ),
                {"now": now, "big": big},
            )
            conn.execute(
                text(
                    "INSERT INTO budget_holds (request_id, scope, scope_id, window_start, amount_units,"
                    " input_micros_per_mtok, cached_input_micros_per_mtok, output_micros_per_mtok, instance_id,"
                    " created_at) VALUES ('r2', 'tenant', 'ten_1', :now, :big, 1, 1, 2, 'i', :now)"
                ),
                {"now": now, "big": big},
            )
            assert conn.execute(text("SELECT spent_units FROM budgets")).scalar_one() == big
            with pytest.raises(Exception):  # noqa: B017 - one budget per (scope, scope_id)
                with conn.begin_nested():
                    conn.execute(
                        text(
                            "INSERT INTO budgets (scope, scope_id, tenant_id, amount_micros, currency, period,"
                            " timezone, window_start, spent_units, reserved_units, updated_by, created_at,"
                            " updated_at) VALUES ('tenant', 'ten_1', 'ten_1', 1, 'USD', 'daily', 'UTC', :now, 0,"
                            " 0, 't', :now, :now)"
                        ),
                        {"now": now},
                    )
        migrate.downgrade(empty_db_url, "0012")
        assert not {"budgets", "budget_holds"} & set(inspect(engine).get_table_names())
        assert _snapshot(engine) == before
        migrate.upgrade(empty_db_url)
        assert _snapshot(engine) == before
        assert {"budgets", "budget_holds"} <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
