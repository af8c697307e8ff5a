"""``kill -9`` of a real ``loraplex serve`` process while budgeted streams run (SQLite and
PostgreSQL): the killed server's holds stay in the database (nothing admitted past them meanwhile),
and the server started again on the same data dir settles them from the usage ledger — the
budget's spend becomes exactly the cost of what the cut streams' records say was served, nothing
stays held, and a second recovery pass changes nothing (no double count)."""

from __future__ import annotations

import threading
from decimal import Decimal

import httpx
import pytest
from billing_helpers import H, auth, new_tenant, usage_rows
from harness.wait import wait_for
from sqlalchemy import create_engine, func, select

from loraplex.platform.budgets.models import BudgetHold

pytestmark = pytest.mark.slow  # real `loraplex serve` processes and kill -9

ENV = {"LORAPLEX_LEDGER__CHECKPOINT_INTERVAL_S": "0.3", "LORAPLEX_ENGINE__MAX_NUM_SEQS": "8"}
PRICE = {"model": "*", "input_per_mtok": "1000", "cached_input_per_mtok": "100", "output_per_mtok": "10000"}


def _stream(url: str, key: str, model: str, i: int, got: list) -> None:
    body = {"model": model, "prompt": f"story {i}", "max_tokens": 400, "ignore_eos": True, "stream": True}
    try:
        with httpx.Client(timeout=httpx.Timeout(300, connect=10)) as c:
            with c.stream("POST", url + "/v1/completions", json=body, headers=auth(key)) as r:
                got.append(r.status_code)
                for _ in r.iter_lines():
                    pass
    except httpx.HTTPError:
        pass  # the server died under it


def _holds(db_url: str) -> int:
    eng = create_engine(db_url)
    try:
        with eng.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(BudgetHold)).scalar_one())
    finally:
        eng.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_kill9_holds_are_settled_from_the_ledger_by_the_next_server(
    backend, request, tmp_path, demo_model_dir, serve_process
):
    env = dict(ENV)
    data = tmp_path / "data"
    db_url = f"sqlite:///{(data / 'loraplex.db').resolve()}"
    if backend == "postgres":
        db_url = env["LORAPLEX_DATABASE_URL"] = request.getfixturevalue("db_url_postgres")
    server = serve_process(data, demo_model_dir, env=env)
    tid, key = new_tenant(server.url, "acme")
    with httpx.Client(base_url=server.url, headers=H, timeout=30) as admin:
        assert admin.post("/admin/v1/prices", json=PRICE).status_code == 201
        assert admin.put(f"/admin/v1/tenants/{tid}/budget", json={"amount": "100"}).status_code == 200
    model = httpx.get(server.url + "/v1/models", headers=auth(key)).json()["data"][0]["id"]
    statuses: list[int] = []
    threads = [
        threading.Thread(target=_stream, args=(server.url, key, model, i, statuses), daemon=True) for i in range(3)
    ]
    for t in threads:
        t.start()

    def streaming() -> bool:  # all three admitted and each checkpointed some tokens
        rows = usage_rows(server.url, tid)
        return len(rows) == 3 and all(r["completion_tokens"] >= 5 for r in rows.values())

    wait_for(streaming, what="three checkpointed streams", timeout=120, interval=0.2)
    server.kill()
    for t in threads:
        t.join(30)
    assert statuses == [200, 200, 200]
    assert _holds(db_url) == 3  # the dead server's holds are still there: nothing admitted past them

    again = serve_process(data, demo_model_dir, env=env)
    wait_for(lambda: _holds(db_url) == 0, what="the dead server's budget holds settled", timeout=120, interval=0.2)
    rows = usage_rows(again.url, tid)
    assert {r["status"] for r in rows.values()} == {"interrupted"}
    want = sum(
        (
            Decimal(r["prompt_tokens"] - r.get("cached_tokens", 0)) * Decimal("0.001")
            + Decimal(r.get("cached_tokens", 0)) * Decimal("0.0001")
            + Decimal(r["completion_tokens"]) * Decimal("0.01")
            for r in rows.values()
        ),
        Decimal(0),
    )
    with httpx.Client(base_url=again.url, headers=H, timeout=30) as admin:
        b = admin.get(f"/admin/v1/tenants/{tid}/budget").json()
        assert (Decimal(b["spent"]), b["reserved"]) == (want, "0")
    from loraplex.platform.budgets.store import BudgetStore
    from loraplex.platform.db.session import make_db_engine, make_session_factory

    eng = make_db_engine(db_url)
    try:
        store = BudgetStore(make_session_factory(eng), "probe", live_instances=lambda _s: [])
        assert store.recover_dead() == 0
    finally:
        eng.dispose()
    with httpx.Client(base_url=again.url, headers=H, timeout=30) as admin:
        assert Decimal(admin.get(f"/admin/v1/tenants/{tid}/budget").json()["spent"]) == want
