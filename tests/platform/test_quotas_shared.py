"""Quota windows shared through the usage ledger (SQLite and PostgreSQL): two servers on one
database hold a tenant to one rpm, one tpm and one token budget between them (not one each), a
restarted server remembers the last minute, and another server's running request counts at its
whole reservation until it ends. The oracle is the ledger itself: the rows each server wrote."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from billing_helpers import H, auth, new_tenant
from harness.examples import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from loraplex.platform.db.base import utcnow
from loraplex.platform.db.session import make_db_engine, make_session_factory, unit_of_work
from loraplex.platform.errors import RateLimited
from loraplex.platform.quotas.shared import LedgerAdmission
from loraplex.platform.quotas.store import InProcessQuotaStore, QuotaView, Reservation
from loraplex.platform.usage import repository
from loraplex.platform.usage.ledger import UsageLedger
from loraplex.platform.usage.models import ServerInstance, UsageRecord


def _rows(live, tenant_id: str) -> list[dict]:
    """The tenant's ledger rows, read from the database (every column, the server's too)."""
    with live.ctx.sessions() as s:
        records = s.scalars(select(UsageRecord).where(UsageRecord.tenant_id == tenant_id)).all()
        return [{c: getattr(r, c) for c in UsageRecord.__table__.columns.keys()} for r in records]


WINDOW = timedelta(seconds=59)  # the limiter's minute, less clock rounding
SECRET = "servers-on-one-database-share-this-secret-0123"  # API keys made on one work on the other


def _server(live_factory):
    return live_factory(secret_key=SECRET)


def _complete(url: str, key: str, model: str, max_tokens: int = 1) -> int:
    body = {"model": model, "prompt": "hi", "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(url + "/v1/completions", json=body, headers=auth(key), timeout=120).status_code


def _peak(rows: list[dict], value) -> int:
    """The most ``value`` in any 60 s window of admissions (anchored at each row's created_at)."""
    times = sorted(r["created_at"] for r in rows)
    return max((sum(value(r) for r in rows if t <= r["created_at"] < t + WINDOW) for t in times), default=0)


def test_two_servers_share_one_rpm_and_one_tpm(live_factory):
    a, b = _server(live_factory), _server(live_factory)
    model = a.ctx.engine.model_name
    rpm_tid, rpm_key = new_tenant(a.url, "rpm", quota={"rpm": 5})
    statuses = [(srv.url, _complete(srv.url, rpm_key, model)) for _ in range(6) for srv in (a, b)]
    assert {s for _, s in statuses} <= {200, 429}
    a.ctx.ledger.flush()
    b.ctx.ledger.flush()
    # the oracle is the ledger, not the clock: whatever the machine's speed, no minute of admissions
    # (on both servers together) holds more than 5 requests; per-server windows would allow 10
    assert _peak(_rows(a, rpm_tid), lambda r: 1) <= 5, statuses

    tid, tpm_key = new_tenant(a.url, "tpm", quota={"tpm": 120})
    for _ in range(8):
        for srv in (a, b):
            _complete(srv.url, tpm_key, model, max_tokens=20)
    a.ctx.ledger.flush()
    b.ctx.ledger.flush()
    rows = _rows(a, tid)
    assert rows and {r["instance_id"] for r in rows} == {a.ctx.ledger.instance_id, b.ctx.ledger.instance_id}
    # what the two servers admitted together in any minute: within the one limit
    assert _peak(rows, lambda r: r["prompt_tokens"] + r["completion_tokens"]) <= 120
    assert _peak(rows, lambda r: r["reserved_tokens"]) <= 120  # even counted at the reservation


def test_two_servers_share_one_token_budget(live_factory):
    a, b = _server(live_factory), _server(live_factory)
    model = a.ctx.engine.model_name
    tid, key = new_tenant(a.url, "budget", quota={"token_budget": 150, "budget_period": "day"})
    statuses = [_complete(srv.url, key, model, max_tokens=20) for _ in range(8) for srv in (a, b)]
    assert 429 in statuses and 200 in statuses
    a.ctx.ledger.flush()
    b.ctx.ledger.flush()
    billed = sum(r["prompt_tokens"] + r["completion_tokens"] for r in _rows(a, tid))
    assert billed <= 150


def test_a_restarted_server_remembers_the_last_minute(live_factory):
    a = _server(live_factory)
    model = a.ctx.engine.model_name
    _tid, key = new_tenant(a.url, "restart", quota={"rpm": 3})
    assert [_complete(a.url, key, model) for _ in range(3)] == [200, 200, 200]
    a.stop()
    b = _server(live_factory)  # the next run on the same database: a fresh process, an empty window
    r = httpx.post(
        b.url + "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1}, headers=auth(key), timeout=60
    )
    if r.status_code == 200:  # only if the machine was so slow that the first request left the window
        first = min(row["created_at"] for row in _rows(b, _tid) if row["instance_id"] != b.ctx.ledger.instance_id)
        assert utcnow() - first >= timedelta(seconds=60), "a restarted server forgot the last minute"
        return
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded", r.text
    assert r.headers["retry-after"] and r.headers["x-ratelimit-remaining-requests"] == "0"


def test_another_servers_running_request_counts_at_its_reservation(live_factory):
    live = live_factory()
    model = live.ctx.engine.model_name
    tid, key = new_tenant(live.url, "neighbour", quota={"tpm": 200})
    row = dict(
        request_id="neighbour-req-1",
        tenant_id=tid,
        api_key_id=None,
        adapter_id=None,
        adapter_name=None,
        endpoint="completions",
        prompt_tokens=3,
        completion_tokens=0,
        reserved_tokens=190,
        ttft_ms=None,
        latency_ms=None,
        status="running",
        instance_id="another-server",
        created_at=utcnow(),
        updated_at=utcnow(),
    )
    with unit_of_work(live.ctx.sessions) as s:
        repository.upsert(s, [row])
        # the neighbour is alive (its lease is fresh, on another host): nobody closes its request
        lease = dict(hostname="elsewhere", pid=1, started_at=utcnow(), heartbeat_at=utcnow() + timedelta(hours=1))
        s.add(ServerInstance(instance_id="another-server", **lease))
    assert _complete(live.url, key, model, max_tokens=20) == 429  # 190 held elsewhere + ~22 > 200
    with unit_of_work(live.ctx.sessions) as s:  # it ends having used 4 tokens: the hold goes
        repository.upsert(s, [{**row, "completion_tokens": 1, "status": "ok", "updated_at": utcnow()}])
    assert _complete(live.url, key, model, max_tokens=20) == 200


@pytest.fixture
def sessions(db_url):
    engine = make_db_engine(db_url)
    yield make_session_factory(engine)
    engine.dispose()


# The budget period's start is pinned (a run across midnight UTC would otherwise change the period
# between two admissions); every ledger row written now is inside it.
PERIOD_WALL = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)


# Each example is a tenant of its own on the one database of the test: the function-scoped
# ``sessions`` fixture is shared by the examples on purpose.
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(st.tuples(st.integers(0, 1), st.integers(1, 80), st.floats(0, 1)), min_size=1, max_size=40),
    tpm=st.integers(50, 2000),
    budget=st.integers(50, 2000),
    rpm=st.integers(1, 30),
)
def test_stores_that_count_each_other_hold_one_limit(sessions, tmp_path, steps, tpm, budget, rpm):
    """The combination rule, as a property: two stores (two servers) on one database, each with the
    production shared window (``LedgerAdmission``: the others' usage read from the ledger and this
    admission's hold written under the tenant's lock) and its own usage ledger that books what a
    request served when it ends, never admit more than one limit between them, whatever the
    interleaving. The oracle is plain counting of what the test admitted and served."""
    tenant = f"ten_{uuid.uuid4().hex[:24]}"  # the column holds 32 characters (PostgreSQL enforces it)
    ledgers = [UsageLedger(sessions, tmp_path / f"spool-{i}") for i in range(2)]  # not started: writes inline
    stores = [
        InProcessQuotaStore(
            lambda t, s: 0, clock=lambda: 0.0, wall=lambda: PERIOD_WALL, shared=LedgerAdmission(sessions, ledger)
        )
        for ledger in ledgers
    ]
    quota = QuotaView(rpm=rpm, tpm=tpm, token_budget=budget, budget_period="day")
    live: list[tuple[int, Reservation, int]] = []
    admitted = served = 0

    def settle(server: int, res: Reservation, used: int) -> None:
        stores[server].settle(res, used)
        ledgers[server].write(  # the request's final record, as inference/generation.py writes it
            request_id=res.request_id,
            tenant_id=tenant,
            endpoint="completions",
            prompt_tokens=used,
            completion_tokens=0,
            reserved_tokens=res.tokens,
            status="ok",
        )
        ledgers[server].flush()

    for server, cost, frac in steps:
        try:
            res = stores[server].reserve(tenant, quota, cost)
        except RateLimited:
            continue
        assert res.held_in_db  # the other store sees it from now on
        admitted += 1
        live.append((server, res, int(frac * cost)))
        if len(live) > 2:
            old_server, old, used = live.pop(0)
            settle(old_server, old, used)
            served += used
    for server, res, used in live:
        settle(server, res, used)
        served += used
    assert admitted <= rpm and served <= min(tpm, budget)


def _fire_together(servers, key: str, model: str, per_server: int, max_tokens: int) -> list[int]:
    """``per_server`` requests at each server, all released at once (a barrier): admissions on the
    two servers fall in the same moment, as they would under real load."""
    import threading

    gate = threading.Barrier(per_server * len(servers))
    codes: list[int] = []

    def one(url: str) -> None:
        gate.wait(120)
        codes.append(_complete(url, key, model, max_tokens=max_tokens))

    threads = [threading.Thread(target=one, args=(s.url,)) for s in servers for _ in range(per_server)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return codes


def test_simultaneous_admissions_on_two_servers_never_pass_one_limit(live_factory):
    """Found open in docs/billing.md: two servers admitting in the same moment both passed a limit
    (each saw the other's admission only once its record was written). Admission now reads the
    others' usage and writes its own hold under one per-tenant database lock (PostgreSQL: an
    advisory lock; SQLite: the write lock). The oracle is the ledger: the rows both servers wrote."""
    a, b = _server(live_factory), _server(live_factory)
    model = a.ctx.engine.model_name
    cases = [
        # rpm and tpm: the most in any minute of admissions (a crowded machine may take longer)
        ({"rpm": 4}, lambda rows: _peak(rows, lambda r: 1), 4),
        ({"tpm": 100}, lambda rows: _peak(rows, lambda r: r["reserved_tokens"]), 100),
        ({"token_budget": 100, "budget_period": "day"}, lambda rows: sum(r["reserved_tokens"] for r in rows), 100),
    ]
    for i, (quota, admitted, limit) in enumerate(cases):
        tid, key = new_tenant(a.url, f"same-moment-{i}", quota=quota)
        codes = _fire_together((a, b), key, model, per_server=6, max_tokens=20)
        assert set(codes) == {200, 429}, (quota, codes)
        a.ctx.ledger.flush()
        b.ctx.ledger.flush()
        rows = _rows(a, tid)
        assert len(rows) == codes.count(200), (quota, codes, rows)  # one row per admitted request, no hold left
        assert admitted(rows) <= limit, (quota, codes, rows)
        assert all(r["status"] == "ok" and r["prompt_tokens"] > 0 for r in rows), rows


def test_a_request_refused_after_it_reserved_leaves_no_hold(live_factory):
    """The shared window writes each admission's hold into the ledger at once; a request refused
    after that (the engine's own checks at submit, a later prompt of a list over the limit) must
    take its hold back: no row, nothing counted by the other servers."""
    live = _server(live_factory)
    model = live.ctx.engine.model_name
    context = int(live.ctx.engine.max_model_len)
    tid, key = new_tenant(live.url, "refused", quota={"token_budget": 10 * context, "budget_period": "day"})
    body = {"model": model, "prompt": "a prompt of several tokens", "max_tokens": context - 1}
    r = httpx.post(live.url + "/v1/completions", json=body, headers=auth(key), timeout=120)
    assert r.status_code == 400, r.text  # prompt + max_tokens > context: refused by the engine at submit
    list_tid, list_key = new_tenant(live.url, "refused-list", quota={"rpm": 2})
    assert _complete(live.url, list_key, model) == 200  # one of the two rpm slots taken
    body = {"model": model, "prompt": ["one", "two"], "max_tokens": 1}
    r = httpx.post(live.url + "/v1/completions", json=body, headers=auth(list_key), timeout=120)
    assert r.status_code == 429, r.text  # the list needs both slots: none of its prompts holds anything
    live.ctx.ledger.flush()
    assert _rows(live, tid) == [] and [row["status"] for row in _rows(live, list_tid)] == ["ok"]
    assert _complete(live.url, list_key, model) == 200  # the second rpm slot was never taken


def test_hostile_mix_at_two_servers_holds_the_limit_and_leaves_no_hold(live_factory):
    """A hostile mix released at once at two servers: n=2 streams, prompt lists and plain requests
    of one tenant with a tpm limit, through an API key with an rpm limit of its own. The tenant's
    tokens stay within one tpm between the servers, the key's own limit writes no ledger rows (key
    scopes are per server), and every row ends settled: none ``running``, none of a key scope."""
    import threading

    a, b = _server(live_factory), _server(live_factory)
    model = a.ctx.engine.model_name
    tid, _ = new_tenant(a.url, "hostile-mix", quota={"tpm": 150})
    r = httpx.post(a.url + f"/admin/v1/tenants/{tid}/keys", json={"rpm": 8}, headers=H, timeout=60)
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    bodies = [
        {"prompt": "hi", "max_tokens": 8, "n": 2, "stream": True},
        {"prompt": ["one", "two", "three"], "max_tokens": 6},
        {"prompt": "hey", "max_tokens": 10},
    ]
    gate = threading.Barrier(12)
    codes: list[int] = []

    def one(url: str, body: dict) -> None:
        gate.wait(120)
        with httpx.Client(timeout=180) as c:
            resp = c.post(url + "/v1/completions", json={"model": model, **body}, headers=auth(key))
            codes.append(resp.status_code)

    threads = [threading.Thread(target=one, args=(s.url, bodies[i % 3])) for s in (a, b) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert set(codes) <= {200, 429} and 200 in codes and 429 in codes, codes
    a.ctx.ledger.flush()
    b.ctx.ledger.flush()
    rows = _rows(a, tid)
    # any minute of admissions, counted at what each request used: an ended request counts at its
    # use, not its reservation (repository.others_usage), so a request that stopped early at EOS
    # (these bodies sample) rightly frees room for another; the reservations may then sum past 150
    used = [(r["reserved_tokens"], r["prompt_tokens"] + r["completion_tokens"], r["created_at"]) for r in rows]
    assert _peak(rows, lambda r: r["prompt_tokens"] + r["completion_tokens"]) <= 150, used
    assert all(r["status"] == "ok" and r["prompt_tokens"] > 0 for r in rows), rows
    with a.ctx.sessions() as s:
        assert not s.scalars(select(UsageRecord).where(UsageRecord.tenant_id.like("key:%"))).all()
