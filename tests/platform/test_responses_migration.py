"""Migration 0008 on a database holding stored responses (SQLite and PostgreSQL): upgraded from
0007 with rows in place, each row gets its UTF-8 size (computed here in Python, the oracle) and its
model from its body, no key (so only unscoped keys see it), and the rows of a tenant deleted
before the upgrade are gone; downgrade and upgrade again keep the rest."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from platform_helpers import BACKENDS, need_postgres, pg_create_database, pg_drop_database
from sqlalchemy import text

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


def test_upgrade_from_0007_keeps_and_measures_stored_responses(empty_db_url):
    migrate.upgrade(empty_db_url, "0007")
    now = datetime(2026, 12, 1, tzinfo=timezone.utc).replace(tzinfo=None)
    rows = {
        "resp_a": ("ten_live", {"id": "resp_a", "model": "bot", "metadata": {"k": "\u00e9\U0001f600"}}),
        "resp_b": ("ten_live", {"id": "resp_b", "model": "demo", "output": []}),
        "resp_c": ("ten_gone", {"id": "resp_c", "model": "bot"}),
    }
    conversation = json.dumps([{"role": "user", "content": "h\u00e9llo \U0001f600"}], ensure_ascii=False)
    engine = make_db_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            for tid, status in (("ten_live", "active"), ("ten_gone", "deleted")):
                conn.execute(
                    text(
                        "INSERT INTO tenants (id, name, priority, weight, status, created_at, updated_at) "
                        "VALUES (:id, :id, 0, 1.0, :status, :now, :now)"
                    ),
                    {"id": tid, "status": status, "now": now},
                )
            for rid, (tid, body) in rows.items():
                conn.execute(
                    text(
                        "INSERT INTO stored_responses (id, tenant_id, conversation, body, created_at) "
                        "VALUES (:id, :tid, :conv, :body, :now)"
                    ),
                    {
                        "id": rid,
                        "tid": tid,
                        "conv": conversation,
                        "body": json.dumps(body, ensure_ascii=False),
                        "now": now,
                    },
                )
        migrate.upgrade(empty_db_url)
        with engine.connect() as conn:
            got = {
                r.id: r
                for r in conn.execute(
                    text("SELECT id, tenant_id, key_id, model, size_bytes, body FROM stored_responses")
                )
            }
        assert set(got) == {"resp_a", "resp_b"}  # the deleted tenant's row is gone
        for rid, row in got.items():
            body = json.dumps(rows[rid][1], ensure_ascii=False)
            assert row.size_bytes == len(conversation.encode()) + len(body.encode()), rid
            assert row.model == rows[rid][1]["model"] and row.key_id is None and row.tenant_id == "ten_live"
        migrate.downgrade(empty_db_url, "0007")
        migrate.upgrade(empty_db_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM stored_responses")).scalar() == 2
    finally:
        engine.dispose()
