"""Budgets in currency, the store (platform/budgets/store.py) on SQLite and PostgreSQL: exact under
concurrency (20 threads on two "servers" racing the last cent), settle to the actual cost (cached
prompt tokens at the cached price), release, a settle applied once, the window reset in the
budget's timezone with an injected clock, a dead server's holds settled from the ledger, and the
alert events (thresholds, one refusal per window)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select

from loraplex.platform.alerts.models import AlertEventRow
from loraplex.platform.alerts.outbox import Outbox
from loraplex.platform.budgets.alerts import BudgetAlerts
from loraplex.platform.budgets.models import Budget, BudgetHold
from loraplex.platform.budgets.periods import window_start
from loraplex.platform.budgets.store import BudgetExceeded, BudgetStore, Cost
from loraplex.platform.db.session import make_db_engine, make_session_factory
from loraplex.platform.pricing.models import Price
from loraplex.platform.usage.models import UsageRecord

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)  # a Sunday
IN, CACHED, OUT = 2_000_000, 500_000, 8_000_000  # micro-units per million tokens: $2 / $0.5 / $8
UNITS = 10**6  # units of 10^-12 per micro-unit


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def sessions(db_url):
    engine = make_db_engine(db_url)
    yield make_session_factory(engine)
    engine.dispose()


def _price(sessions, model="*", at=datetime(2026, 1, 1, tzinfo=timezone.utc)):
    with sessions() as s:
        s.add(
            Price(
                model=model,
                currency="USD",
                input_micros_per_mtok=IN,
                cached_input_micros_per_mtok=CACHED,
                output_micros_per_mtok=OUT,
                effective_from=at,
                created_by="t",
            )
        )
        s.commit()


def _budget(sessions, scope, sid, micros, period="monthly", tz="UTC", now=T0, tenant="ten_1"):
    with sessions() as s:
        s.add(
            Budget(
                scope=scope,
                scope_id=sid,
                tenant_id=tenant,
                amount_micros=micros,
                currency="USD",
                period=period,
                timezone=tz,
                window_start=window_start(period, tz, now),
                spent_units=0,
                reserved_units=0,
                updated_by="t",
            )
        )
        s.commit()


def _row(sessions, scope="tenant", sid="ten_1") -> Budget:
    with sessions() as s:
        b = s.get(Budget, (scope, sid))
        s.expunge_all()
        return b


def _store(sessions, clock=None, instance="inst_a", live=("inst_a", "inst_b"), alerts=None) -> BudgetStore:
    return BudgetStore(
        sessions, instance, live_instances=lambda _s: list(live), alerts=alerts, clock=clock or Clock(T0), sweep_s=3600
    )


# one request: 1000 prompt tokens at $2/M = 0.002 + 1000 output at $8/M = 0.008 -> $0.01 worst case
WORST = 1000 * IN + 1000 * OUT


def test_no_budget_means_nothing_is_held(sessions):
    _price(sessions)
    st = _store(sessions)
    assert st.reserve([("tenant", "ten_1"), ("key", "key_1")], [Cost("r1", 1000, 1000)], None, "m") is None


def test_twenty_concurrent_requests_race_the_last_cent_on_two_servers(sessions):
    _price(sessions)
    # room for exactly 7 worst cases, and one unit short of an 8th
    _budget(sessions, "tenant", "ten_1", (8 * WORST - 1) // UNITS)
    servers = [_store(sessions, instance="inst_a"), _store(sessions, instance="inst_b")]
    admitted, refused, errors = [], [], []
    go = threading.Barrier(20)

    def one(i: int) -> None:
        go.wait()
        try:
            t = servers[i % 2].reserve(
                [("tenant", "ten_1"), ("key", f"key_{i}")], [Cost(f"r{i}", 1000, 1000)], None, "m"
            )
            admitted.append(t)
        except BudgetExceeded as exc:
            refused.append(exc)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(admitted) == 7 and len(refused) == 13
    b = _row(sessions)
    assert b.reserved_units == 7 * WORST and b.spent_units == 0
    assert refused[0].status_code == 429 and refused[0].code == "insufficient_quota"
    assert refused[0].type == "insufficient_quota"
    # settle them all at a fraction of the worst case: the exact cost lands in spent
    for i, tickets in enumerate(admitted):
        servers[i % 2].settle(tickets[0], 1000, 400, 10)
    for s in servers:
        assert s.flush()
    b = _row(sessions)
    each = 600 * IN + 400 * CACHED + 10 * OUT
    assert (b.reserved_units, b.spent_units) == (0, 7 * each)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(BudgetHold)) == 0


def test_prompt_list_and_n_are_held_whole_and_refused_whole(sessions):
    _price(sessions)
    _budget(sessions, "tenant", "ten_1", (3 * WORST) // UNITS)
    st = _store(sessions)
    # n = 2: max_output_tokens is n x max_tokens
    costs = [Cost("a", 1000, 2 * 1000), Cost("b", 1000, 1000)]  # 0.002+0.016 + 0.01 = 0.028 > 0.03? no: fits
    assert sum(1000 * IN + o * OUT for o in (2000, 1000)) <= 3 * WORST
    tickets = st.reserve([("tenant", "ten_1")], costs, None, "m")
    assert tickets is not None and len(tickets) == 2
    with pytest.raises(BudgetExceeded, match="these 2 prompts"):
        st.reserve([("tenant", "ten_1")], [Cost("c", 1, 0), Cost("d", 1000, 1000)], None, "m")
    with sessions() as s:  # nothing of the refused list is held
        assert sorted(s.scalars(select(BudgetHold.request_id))) == ["a", "b"]


def test_every_budget_that_applies_is_checked_key_and_tenant(sessions):
    _price(sessions)
    _budget(sessions, "tenant", "ten_1", 1_000_000)  # $1
    _budget(sessions, "key", "key_1", WORST // UNITS)  # exactly one request
    st = _store(sessions)
    scopes = [("tenant", "ten_1"), ("key", "key_1")]
    t = st.reserve(scopes, [Cost("r1", 1000, 1000)], None, "m")
    with pytest.raises(BudgetExceeded, match="key's budget"):
        st.reserve(scopes, [Cost("r2", 1000, 1000)], None, "m")
    assert _row(sessions).reserved_units == WORST  # the tenant's hold of r2 rolled back with the refusal
    st.release(t[0])
    st.flush()
    assert _row(sessions).reserved_units == 0 and _row(sessions).spent_units == 0
    assert _row(sessions, "key", "key_1").reserved_units == 0


def test_a_settle_sent_twice_applies_once(sessions):
    _price(sessions)
    _budget(sessions, "tenant", "ten_1", 1_000_000)
    st = _store(sessions)
    (t,) = st.reserve([("tenant", "ten_1")], [Cost("r1", 1000, 1000)], None, "m")
    assert st.settle_now("r1", 1000, 0, 100) == 1
    assert st.settle_now("r1", 1000, 0, 100) == 0  # a recovery or a late worker finds nothing
    st.settle(t, 1000, 0, 100)
    st.flush()
    assert _row(sessions).spent_units == 1000 * IN + 100 * OUT


def test_no_price_admits_at_zero_cost_until_the_budget_is_spent(sessions):
    _budget(sessions, "tenant", "ten_1", 1)
    st = _store(sessions)
    (t,) = st.reserve([("tenant", "ten_1")], [Cost("r1", 10**6, 10**6)], None, "m")  # unpriced: 0
    assert t.amount_units == 0
    with sessions() as s:
        s.get(Budget, ("tenant", "ten_1")).spent_units = 10**6  # spent already (one micro-unit)
        s.commit()
    with pytest.raises(BudgetExceeded):
        st.reserve([("tenant", "ten_1")], [Cost("r2", 1, 1)], None, "m")


def test_a_request_that_could_never_fit_is_refused(sessions):
    _price(sessions)
    _budget(sessions, "tenant", "ten_1", 1)  # one micro-dollar
    with pytest.raises(BudgetExceeded, match="may cost up to 0.01"):
        _store(sessions).reserve([("tenant", "ten_1")], [Cost("r1", 1000, 1000)], None, "m")


@pytest.mark.parametrize(
    ("period", "tz", "before", "after"),
    [
        # Tokyo's midnight is 15:00 UTC the day before
        (
            "daily",
            "Asia/Tokyo",
            datetime(2026, 12, 6, 14, 59, tzinfo=timezone.utc),
            datetime(2026, 12, 6, 15, 0, tzinfo=timezone.utc),
        ),
        # weeks start on Monday (2026-12-07) in New York (UTC-5)
        (
            "weekly",
            "America/New_York",
            datetime(2026, 12, 7, 4, 59, tzinfo=timezone.utc),
            datetime(2026, 12, 7, 5, 0, tzinfo=timezone.utc),
        ),
        (
            "monthly",
            "Europe/Paris",
            datetime(2026, 12, 31, 22, 59, tzinfo=timezone.utc),
            datetime(2026, 12, 31, 23, 0, tzinfo=timezone.utc),
        ),
    ],
)
def test_the_window_resets_at_the_period_boundary_in_the_budgets_timezone(sessions, period, tz, before, after):
    _price(sessions)
    clock = Clock(before)
    _budget(sessions, "tenant", "ten_1", WORST // UNITS, period=period, tz=tz, now=before)
    st = _store(sessions, clock)
    (t,) = st.reserve([("tenant", "ten_1")], [Cost("r1", 1000, 1000)], None, "m")
    st.settle(t, 1000, 0, 1000)
    st.flush()
    with pytest.raises(BudgetExceeded):
        st.reserve([("tenant", "ten_1")], [Cost("r2", 1000, 1000)], None, "m")
    clock.now = after
    (t2,) = st.reserve([("tenant", "ten_1")], [Cost("r3", 1000, 1000)], None, "m")
    b = _row(sessions)
    assert b.window_start == after and b.spent_units == 0 and b.reserved_units == WORST


def test_a_hold_from_the_previous_window_settles_into_nothing(sessions):
    _price(sessions)
    clock = Clock(datetime(2026, 12, 6, 23, 59, tzinfo=timezone.utc))
    _budget(sessions, "tenant", "ten_1", 1_000_000, period="daily", now=clock.now)
    st = _store(sessions, clock)
    (old,) = st.reserve([("tenant", "ten_1")], [Cost("r1", 1000, 1000)], None, "m")
    clock.now = datetime(2026, 12, 7, 0, 1, tzinfo=timezone.utc)
    (new,) = st.reserve([("tenant", "ten_1")], [Cost("r2", 1000, 1000)], None, "m")
    st.settle(old, 1000, 0, 1000)
    st.flush()
    b = _row(sessions)
    assert (b.spent_units, b.reserved_units) == (0, WORST)  # the new window keeps only r2's hold


def test_total_never_resets(sessions):
    _price(sessions)
    clock = Clock(T0)
    _budget(sessions, "tenant", "ten_1", WORST // UNITS, period="total")
    st = _store(sessions, clock)
    (t,) = st.reserve([("tenant", "ten_1")], [Cost("r1", 1000, 1000)], None, "m")
    st.settle(t, 1000, 0, 1000)
    st.flush()
    clock.now = datetime(2031, 1, 1, tzinfo=timezone.utc)
    with pytest.raises(BudgetExceeded, match="never resets"):
        st.reserve([("tenant", "ten_1")], [Cost("r2", 1, 1)], None, "m")


def test_a_dead_servers_holds_are_settled_from_the_ledger_once(sessions):
    _price(sessions)
    _budget(sessions, "tenant", "ten_1", 1_000_000)
    dead = _store(sessions, instance="inst_dead")
    (t1,) = dead.reserve([("tenant", "ten_1")], [Cost("r1", 1000, 1000)], None, "m")
    (t2,) = dead.reserve([("tenant", "ten_1")], [Cost("r2", 1000, 1000)], None, "m")
    with sessions() as s:  # r1 served 50 tokens before the kill (its checkpointed record); r2 nothing
        s.add(
            UsageRecord(
                request_id="r1",
                tenant_id="ten_1",
                prompt_tokens=1000,
                cached_tokens=200,
                completion_tokens=50,
                status="interrupted",
                instance_id="inst_dead",
            )
        )
        s.commit()
    alive = _store(sessions, instance="inst_a", live=("inst_a",))
    assert alive.recover_dead() == 2
    assert alive.recover_dead() == 0
    b = _row(sessions)
    assert (b.reserved_units, b.spent_units) == (0, 800 * IN + 200 * CACHED + 50 * OUT)
    dead.settle(t1, 1000, 0, 1000)  # the "dead" process was only slow: its late settle is a no-op
    dead.flush()
    assert _row(sessions).spent_units == 800 * IN + 200 * CACHED + 50 * OUT


def test_alerts_thresholds_and_one_refusal_per_window(sessions):
    _price(sessions)
    _budget(sessions, "tenant", "ten_1", (2 * WORST) // UNITS)
    alerts = BudgetAlerts(Outbox(sessions), (50, 80, 100))
    st = _store(sessions, alerts=alerts)
    st.reserve([("tenant", "ten_1")], [Cost("r1", 1000, 1000)], None, "m")  # 50 %
    st.reserve([("tenant", "ten_1")], [Cost("r2", 1000, 1000)], None, "m")  # 100 %
    for i in range(3):
        with pytest.raises(BudgetExceeded):
            st.reserve([("tenant", "ten_1")], [Cost(f"x{i}", 1000, 1000)], None, "m")
    with sessions() as s:
        rows = list(s.scalars(select(AlertEventRow).order_by(AlertEventRow.dedupe_key)))
    keys = [r.dedupe_key for r in rows]
    assert len(keys) == 4, keys  # 50, 80, 100 and one refusal
    assert all(":tenant:ten_1:budget:" in k for k in keys)
    assert sum(k.startswith("limit.refused") for k in keys) == 1
    assert '"unit":"USD"' in rows[0].body and '"rule":"budget"' in rows[0].body


@pytest.mark.slow  # a PostgreSQL server of its own, stopped and started
def test_postgres_stopped_admission_is_503_and_a_settle_waits_for_it(private_postgres):
    """The database down: a budgeted admission is a 503 (money is not admitted on a guess), a
    settle queued meanwhile is kept and lands once the database is back."""
    from loraplex.platform.db import migrate
    from loraplex.platform.errors import ServiceUnavailable

    pg = private_postgres  # started
    migrate.upgrade(pg.url)
    engine = make_db_engine(pg.url)
    sessions = make_session_factory(engine)
    try:
        _price(sessions)
        _budget(sessions, "tenant", "ten_1", 1_000_000)
        st = _store(sessions)
        (t,) = st.reserve([("tenant", "ten_1")], [Cost("r1", 1000, 1000)], None, "m")
        pg.stop()
        engine.dispose()
        with pytest.raises(ServiceUnavailable):
            st.reserve([("tenant", "ten_1")], [Cost("r2", 1000, 1000)], None, "m")
        st.settle(t, 1000, 0, 10)
        assert not st.flush(timeout=2.5)  # held in the queue, retried
        pg.start()
        assert st.flush(timeout=120)
        b = _row(sessions)
        assert (b.reserved_units, b.spent_units) == (0, 1000 * IN + 10 * OUT)
        st.close()
    finally:
        engine.dispose()


def test_an_adapters_own_price_is_the_one_held(sessions):
    _price(sessions)  # "*": $2 / $8
    with sessions() as s:
        s.add(
            Price(
                model="bot",
                currency="USD",
                input_micros_per_mtok=IN * 100,
                cached_input_micros_per_mtok=CACHED,
                output_micros_per_mtok=OUT * 100,
                effective_from=datetime(2026, 1, 1, tzinfo=timezone.utc),
                created_by="t",
            )
        )
        s.commit()
    _budget(sessions, "tenant", "ten_1", (50 * WORST) // UNITS)
    st = _store(sessions)
    assert st.reserve([("tenant", "ten_1")], [Cost("base", 1000, 1000)], None, "m")[0].amount_units == WORST
    with pytest.raises(BudgetExceeded):  # the adapter costs 100 x the base model
        st.reserve([("tenant", "ten_1")], [Cost("ada", 1000, 1000)], "bot", "m")


def test_a_request_cancelled_while_its_hold_is_taken_gives_it_back(sessions):
    """The client leaves while the admission's worker thread takes the budget hold: once the
    thread is done, the hold and the token reservation are given back (never left unowned)."""
    import asyncio
    from types import SimpleNamespace

    from loraplex.platform.budgets import admission as budget_admission

    _price(sessions)
    _budget(sessions, "tenant", "ten_1", 1_000_000)
    store = _store(sessions)
    entered, proceed = threading.Event(), threading.Event()
    real = store.reserve

    def slow_reserve(*args, **kwargs):
        entered.set()
        proceed.wait(30)
        return real(*args, **kwargs)

    store.reserve = slow_reserve  # type: ignore[method-assign]
    cancelled: list = []
    ctx = SimpleNamespace(
        budgets=store,
        quotas=SimpleNamespace(cancel=cancelled.append),
        engine=SimpleNamespace(model_name="m"),
    )
    prep = SimpleNamespace(
        auth=SimpleNamespace(tenant_id="ten_1", key_id="key_1", project=None),
        request_id="r1",
        prompt_ids=[1] * 1000,
        params=SimpleNamespace(n=1, max_tokens=1000),
        model="m",
        reservation="token-hold",
        budget=None,
    )

    async def main() -> None:
        task = asyncio.ensure_future(budget_admission.reserve(ctx, SimpleNamespace(adapter=None), [prep]))
        await asyncio.to_thread(entered.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proceed.set()
        for _ in range(600):  # the thread finishes; its done-callback gives everything back
            if cancelled:
                break
            await asyncio.sleep(0.05)

    asyncio.run(main())
    assert cancelled == ["token-hold"]
    assert store.flush()
    b = _row(sessions)
    assert (b.reserved_units, b.spent_units) == (0, 0)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(BudgetHold)) == 0


def test_a_project_budget_is_enforced_with_its_own_alert_subject(sessions):
    """A project's key is charged against its project's budget too, with the project as the alert subject."""
    from types import SimpleNamespace

    from loraplex.platform.budgets.owners import request_scopes

    _price(sessions)
    _budget(sessions, "tenant", "ten_1", 1_000_000)
    _budget(sessions, "project", "prj_1", WORST // UNITS)
    auth = SimpleNamespace(tenant_id="ten_1", key_id="key_1", project=SimpleNamespace(project_id="prj_1"))
    scopes = request_scopes(auth)
    assert scopes == [("key", "key_1"), ("project", "prj_1"), ("tenant", "ten_1")]
    st = _store(sessions, alerts=BudgetAlerts(Outbox(sessions), (100,)))
    st.reserve(scopes, [Cost("r1", 1000, 1000)], None, "m")
    with pytest.raises(BudgetExceeded, match="project's budget"):
        st.reserve(scopes, [Cost("r2", 1000, 1000)], None, "m")
    with sessions() as s:
        keys = sorted(s.scalars(select(AlertEventRow.dedupe_key)))
        bodies = list(s.scalars(select(AlertEventRow.body)))
    assert [k.split(":2026")[0] for k in keys] == [
        "limit.refused:project:prj_1:budget",
        "limit.threshold:project:prj_1:budget",
    ]
    assert all('"project_id":"prj_1"' in b and '"scope":"project"' in b for b in bodies)
