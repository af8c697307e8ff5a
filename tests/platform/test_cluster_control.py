"""The control-plane actor's logic, driven as a plain object (Ray only makes it remote): quota
reservations keyed for remote callers, the versioned desired engine state replicas pull, and the
replica registry that forgets silent replicas."""

from __future__ import annotations

import time
import uuid

import pytest

from loraplex.platform.adapters.sources.uri import AdapterReference
from loraplex.platform.cluster.control import ControlConfig, ControlPlane
from loraplex.platform.cluster.messages import (
    AbortMatch,
    EngineState,
    HeldReservation,
    Hold,
    Refusal,
    ReplicaReport,
    ReserveAnswer,
    ReserveItem,
    StoredAdapter,
    TenantSettings,
)
from loraplex.platform.errors import RateLimited
from loraplex.platform.quotas.store import QuotaView


def _plane(**kw) -> ControlPlane:
    return ControlPlane(ControlConfig("sqlite://", **kw))


def _reserve(cp: ControlPlane, q: QuotaView, tokens: int, key: str | None = None, owner: str = "") -> ReserveAnswer:
    return cp.reserve_many(owner, [ReserveItem(key or uuid.uuid4().hex, "t", q, tokens)])[0]


def _held(answer: ReserveAnswer) -> Hold:
    assert isinstance(answer, Hold), answer
    return answer


def _refused(answer: ReserveAnswer) -> Refusal:
    assert isinstance(answer, Refusal), answer
    return answer


def test_reservations_by_key_are_exact_and_refunds_work():
    cp = _plane()
    q = QuotaView(rpm=3, tpm=100, max_concurrent=2)
    a, b = _held(_reserve(cp, q, 30)), _held(_reserve(cp, q, 30))
    assert a.key != b.key
    refused = _refused(_reserve(cp, q, 30))  # the concurrency cap of 2
    assert refused.message.startswith("too many concurrent requests")
    with pytest.raises(RateLimited) as exc:
        raise refused.error()
    assert exc.value.headers["retry-after"] == "1" and exc.value.code == "rate_limit_exceeded"
    assert cp.running("t") == 2
    cp.cancel(a.key)  # refused after reserving: the rpm slot comes back too
    cp.settle(b.key, 10)  # served 10 of the 30 held
    cp.settle(b.key, 10)  # a second settle of the same key changes nothing
    assert cp.running("t") == 0
    c = _held(_reserve(cp, q, 90))  # tpm window holds 10 (b as served), so 90 fits exactly
    assert c.headers["x-ratelimit-remaining-tokens"] == "0"
    assert _refused(_reserve(cp, q, 1)).message.startswith("rate limit reached: 100 tokens")


def test_state_is_versioned_and_only_changes_bump_it():
    cp = _plane()
    v0 = cp.desired.version
    assert cp.state(-1) == EngineState(v0, {}, {})
    v1 = cp.set_tenant("t", TenantSettings(0, 1.0, None))
    assert v1 == v0 + 1
    assert cp.set_tenant("t", TenantSettings(0, 1.0, None)) == v1  # the same value again is no change
    v2 = cp.add_adapter("ad", StoredAdapter("/store/ad"))
    assert v2 == v1 + 1 and cp.state(v2) is None  # an up-to-date replica gets nothing
    ref = AdapterReference("s3://b/ad/", "ab" * 32)
    v3 = cp.add_adapter("ad", ref)  # the same key, now by reference: a change
    assert v3 == v2 + 1 and cp.add_adapter("ad", AdapterReference("s3://b/ad/", "ab" * 32)) == v3
    assert cp.state(v2) == EngineState(v3, {"t": TenantSettings(0, 1.0, None)}, {"ad": ref})
    v4 = cp.remove_adapter("ad")
    assert v4 == v3 + 1 and cp.remove_adapter("ad") == v4
    assert cp.state(v1) == EngineState(v4, {"t": TenantSettings(0, 1.0, None)}, {})


def test_replicas_that_stop_reporting_are_forgotten(monkeypatch):
    # a clock the test moves: a descheduled test process (two CPU burners beside it) must not age
    # the reports between two lines
    from loraplex.platform.cluster import registry

    now = [1000.0]
    monkeypatch.setattr(registry.time, "time", lambda: now[0])
    cp = _plane(replica_ttl_s=0.2)

    def report(name: str, pid: int, served: dict[str, float]) -> dict[str, float]:
        return cp.report(ReplicaReport(name, pid, 0, {"running": True}), served).others

    assert report("engine-a", 1, {"t": 5.0}) == {}
    assert report("engine-b", 2, {"t": 2.0}) == {"t": 5.0}  # what the OTHER replicas served
    assert [r.replica for r in cp.replica_registry.replicas()] == ["engine-a", "engine-b"]
    now[0] += 0.3
    report("engine-b", 2, {"t": 3.0})
    assert [r.pid for r in cp.replica_registry.replicas()] == [2]
    assert report("engine-b", 2, {"t": 3.0}) == {"t": 5.0}  # a gone replica's service still counts
    cp.forget("engine-b")
    assert cp.replica_registry.replicas() == []


def test_a_restarted_instance_rebuilds_state_from_the_db_and_adopts_live_reservations(tmp_path, db_url, monkeypatch):
    """What Ray's restart gives: a new instance, same arguments. The desired engine state comes
    back from the database (the oracle: the rows), versions keep growing, and the reservations the
    ingresses still hold are adopted, so a concurrency cap stays exact across the restart."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from loraplex.platform.adapters.models import Adapter
    from loraplex.platform.cluster.quota_store import ActorQuotaStore
    from loraplex.platform.tenants.models import Tenant

    engine = create_engine(db_url)
    with Session(engine) as s:
        s.add(Tenant(name="acme", priority=2, weight=3.0))
        s.add(Tenant(name="gone", status="deleted"))
        facts = {"rank": 4, "alpha": 8.0}
        s.add(Adapter(name="up", sha256="1" * 64, storage_path="ab/up", **facts))
        s.add(Adapter(name="ref", sha256="2" * 64, storage_path="", source_uri="s3://b/ref/", **facts))
        s.add(Adapter(name="old", sha256="3" * 64, storage_path="ab/old", status="superseded", **facts))
        s.commit()
        acme = s.query(Tenant).filter_by(name="acme").one().id
        ids = {a.name: a.id for a in s.query(Adapter)}
    engine.dispose()
    old = ControlPlane(ControlConfig(db_url, store_root=str(tmp_path / "store")))
    state = old.state(-1)
    assert state is not None and state.tenants == {acme: TenantSettings(2, 3.0, None)}  # deleted ones are not pushed
    # an upload is its store folder; an adapter registered by reference stays a reference, which
    # each replica fetches itself (a store path would point replicas at the store's root)
    assert state.adapters == {
        ids["up"]: StoredAdapter(str(tmp_path / "store" / "ab" / "up")),
        ids["ref"]: AdapterReference("s3://b/ref/", "2" * 64),
    }

    class Direct:  # the actor handle's shape, calling the object in this thread
        def __init__(self, target):
            self.target = target

        def __getattr__(self, name):
            fn = getattr(self.target, name)
            return type("M", (), {"remote": staticmethod(lambda *a, **k: fn(*a, **k))})

    handle = Direct(old)
    store = ActorQuotaStore(handle)
    import loraplex.platform.cluster.quota_store as qs

    async def direct(submit, what="", budget_s=0.0):  # no Ray: the value is the answer
        return submit()

    monkeypatch.setattr(qs, "_await_actor", direct)
    q = QuotaView(max_concurrent=2, tpm=1000)
    a = store.reserve("t", q, 100)
    b = store.reserve("t", q, 100)
    store.settle(b, 50)  # ended before the restart: not adopted
    new = ControlPlane(ControlConfig(db_url, store_root=str(tmp_path / "store")))
    assert new.epoch != old.epoch and new.desired.version > old.desired.version
    handle.target = new
    c = store.reserve("t", q, 100)  # the answer carries the new epoch: `a` is adopted
    assert new.running("t") == 2  # a (adopted) and c
    assert _refused(_reserve(new, q, 1)).message.startswith("too many concurrent requests")
    with pytest.raises(RateLimited):
        store.reserve("t", q, 1)  # refused by the actor: the store remembers it briefly
    handle.target = None  # any call to the actor now would fail: the precheck answers from memory
    with pytest.raises(RateLimited) as exc:
        store.precheck("t", q)
    assert exc.value.message.startswith("too many concurrent requests")
    handle.target = new
    store.settle(a, 10)
    store.settle(c, 10)
    assert new.running("t") == 0 and new.live_reservations() == 0


class _Direct:
    """The actor handle's shape (``handle.method.remote(...)``), calling the object in this thread."""

    def __init__(self, target):
        self.target = target
        self.calls: list[str] = []

    def __getattr__(self, name):
        def call(*a, **k):
            self.calls.append(name)
            return getattr(self.target, name)(*a, **k)

        return type("M", (), {"remote": staticmethod(call)})


def test_a_silent_ingress_loses_its_holds_after_the_lease_and_a_stalled_one_readopts():
    """Ingress A holds two reservations and stops calling (killed); ingress B keeps ticking. After
    the lease the actor has released A's holds: the tenant's concurrency slots and tpm are free
    again (the oracle: fresh reservations that fill both exactly), the rpm requests still count.
    A stalled A that comes back is told at its snapshot and adopts its live holds again."""
    cp = _plane(ingress_lease_s=0.3)
    q = QuotaView(rpm=10, tpm=200, max_concurrent=2)
    a1 = cp.reserve_many("ingress-a", [ReserveItem("k1", "t", q, 100), ReserveItem("k2", "t", q, 100)])
    assert [_held(a).key for a in a1] == ["k1", "k2"]
    assert _refused(_reserve(cp, q, 1, "k3", "ingress-b")).message.startswith("too many")
    # the same key again (an answer lost, the call sent again) is the same hold, not a second one
    assert _held(_reserve(cp, q, 100, "k1", "ingress-a")).key == "k1" and cp.running("t") == 2
    deadline = time.monotonic() + 30
    while cp.running("t") and time.monotonic() < deadline:
        cp.snapshot("ingress-b", 0, 0)  # B renews its lease; A is silent
        time.sleep(0.05)
    assert cp.running("t") == 0 and cp.live_reservations() == 0
    assert cp.snapshot("ingress-b", 0, 0).control.released_by_lease == 2
    b = cp.reserve_many("ingress-b", [ReserveItem("k4", "t", q, 100), ReserveItem("k5", "t", q, 100)])
    assert all(isinstance(x, Hold) for x in b), b  # both slots and all 200 tokens of the window are back
    assert cp.usage_now("t")["requests_last_minute"] == 4  # k1, k2 were made (released, still counted), k4, k5
    cp.settle("k4", 0)
    cp.settle("k5", 0)
    # A was only stalled: its next snapshot says so, and it hands back what it still holds
    snap = cp.snapshot("ingress-a", 1, 0)
    assert snap.readopt is True and cp.snapshot("ingress-a", 1, 0).readopt is False
    assert cp.adopt([HeldReservation("k1", "t", 100, None)], "ingress-a") == 1
    assert cp.running("t") == 1
    cp.settle("k1", 40)
    assert cp.running("t") == 0 and cp.live_reservations() == 0


def test_the_ingress_store_batches_concurrent_reserves_into_few_actor_calls(monkeypatch):
    """20 admissions from 20 request threads at once: the first reserve_many is held until all
    the others are queued, so they travel in ONE second call; the cap is exact (the oracle: the
    plain actor object's counters), keys are distinct, and every refusal is the cap's."""
    import asyncio
    import threading

    import loraplex.platform.cluster.quota_store as qs
    from loraplex.platform.cluster.quota_store import ActorQuotaStore

    cp = _plane()
    handle = _Direct(cp)
    store = ActorQuotaStore(handle, owner="ingress-x")

    async def held_first(submit, what="", budget_s=0.0):
        if handle.calls.count("reserve_many") == 0:
            # the first batch is whatever was queued when the sender woke (on a loaded machine,
            # more than one): the rest of the 20 queue behind it. The bound is only a backstop,
            # well inside the store's own 60 s for an answer.
            first = len(submit.args[1])  # functools.partial(reserve_many.remote, owner, items)
            deadline = time.monotonic() + 20
            while len(store._queue) < 20 - first and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        return submit()

    monkeypatch.setattr(qs, "_await_actor", held_first)
    q = QuotaView(max_concurrent=5)
    got: list[object] = []

    def admit():
        try:
            got.append(store.reserve("t", q, 10))
        except RateLimited as exc:
            got.append(exc)

    threads = [threading.Thread(target=admit) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    held = [r for r in got if not isinstance(r, RateLimited)]
    assert len(got) == 20 and len(held) == 5 == cp.running("t")
    assert len({r.key for r in held}) == 5
    assert {r.message for r in got if isinstance(r, RateLimited)} == {"too many concurrent requests (max_concurrent=5)"}
    assert handle.calls.count("reserve_many") == 2
    for r in held:
        store.settle(r, 3)
    assert cp.running("t") == 0 and store.live_count() == 0


def test_a_tenant_without_limits_is_admitted_without_waiting_for_the_actor(monkeypatch):
    """A view with no limit cannot be refused, so the ingress does not wait for the actor (a
    restarting control plane stalls nobody who has no quota), yet the actor records the hold
    before the request's settle (drains and running counts see it), and a new instance adopts it.
    A limited view still waits for the actor's answer."""
    import loraplex.platform.cluster.quota_store as qs
    from loraplex.platform.cluster.quota_store import ActorQuotaStore

    cp = _plane()
    handle = _Direct(cp)
    store = ActorQuotaStore(handle, owner="ingress-x")
    waited: list[str] = []

    async def counted(submit, what="", budget_s=0.0):
        waited.append(what)
        return submit()

    monkeypatch.setattr(qs, "_await_actor", counted)
    free = store.reserve("t", QuotaView(), 50)
    assert waited == [] and handle.calls == ["reserve_many"], (waited, handle.calls)
    assert cp.running("t") == 1 and cp.live_reservations() == 1 and store.live_count() == 1
    store.saw_epoch(cp.epoch)
    new = _plane()  # restarted: the hold is handed back at the new epoch
    handle.target = new
    store.saw_epoch(new.epoch)
    assert new.running("t") == 1, new.live_reservations()
    store.settle(free, 20)
    assert new.running("t") == 0 and new.live_reservations() == 0 and store.live_count() == 0
    limited = store.reserve("t", QuotaView(max_concurrent=1), 50)
    assert waited == ["the quota coordinator"] and new.running("t") == 1
    store.cancel(limited)
    assert new.live_reservations() == 0


def test_admin_aborts_and_draining_reach_every_ingress_snapshot():
    cp = _plane()
    first = cp.snapshot("ingress-a", 0, 0)
    assert first.aborts == [] and first.draining is False
    seq = cp.broadcast_abort("key revoked", AbortMatch(key_id="k1"))
    for name in ("ingress-a", "ingress-b"):
        snap = cp.snapshot(name, 3, 0)
        assert [(a.reason, a.match.key_id) for a in snap.aborts] == [("key revoked", "k1")]
        assert snap.abort_seq == seq
    assert cp.snapshot("ingress-a", 0, seq).aborts == []  # each abort is applied once
    cp.set_draining(True)
    assert not cp.drain_acknowledged()  # ingress-a has not been told yet
    assert cp.snapshot("ingress-b", 1, seq).draining is True
    cp.snapshot("ingress-a", 0, seq)
    assert cp.drain_acknowledged() and cp.ingresses.in_flight() == 1


def test_prefix_keys_chain_blocks_and_are_namespaced_by_tenant_and_adapter():
    from loraplex.platform.cluster.routing import SPAN, prefix_keys

    prompt = list(range(3 * SPAN + 5))
    keys = prefix_keys(prompt, "ad", "t1")
    assert len(keys) == 3  # full spans only
    longer = prefix_keys(prompt + [7] * SPAN, "ad", "t1")
    assert longer[:3] == keys and len(longer) == 4  # a longer turn of the same chat extends the chain
    changed = list(prompt)
    changed[SPAN + 1] += 1  # the second block differs: the first key still matches, no later one
    other = prefix_keys(changed, "ad", "t1")
    assert other[0] == keys[0] and not set(other[1:]) & set(keys)
    assert not set(prefix_keys(prompt, "ad", "t2")) & set(keys)  # another tenant: nothing shared
    assert not set(prefix_keys(prompt, None, "t1")) & set(keys)  # the base model: nothing shared


def test_router_scoring_prefers_cache_then_adapter_and_the_guard_caps_load():
    from loraplex.platform.cluster.routing import GUARD, PrefixSummary, prefix_keys, rank, score

    prompt = list(range(4 * 32))
    keys = prefix_keys(prompt, None, "t")
    warm, cold = PrefixSummary(), PrefixSummary()
    warm.add(keys[:3])
    held_warm, held_cold = frozenset(warm.snapshot()), frozenset(cold.snapshot())
    s_warm, matched = score(keys, held_warm, False, 2, 32)
    s_cold, _ = score(keys, held_cold, False, 0, 32)
    assert matched == 3 and s_warm > s_cold
    assert rank([("cold", s_cold, 0), ("warm", s_warm, 2)]) == [["warm"], ["cold"]]
    # the cache does not win over a much busier replica
    s_busy, _ = score(keys, held_warm, False, GUARD + 1, 32)
    assert rank([("warm", s_busy, GUARD + 1), ("cold", s_cold, 0)]) == [["cold"], ["warm"]]
    # adapter residency breaks a tie in prefix
    s_res, _ = score(keys, held_cold, True, 0, 32)
    assert s_res > s_cold
    small = PrefixSummary(max_keys=2)
    small.add([1, 2, 3])
    assert small.snapshot() == [2, 3]  # bounded: the least recently served go first


def test_a_settle_that_arrives_before_the_adopt_of_its_key_is_not_undone():
    """After a restart an ingress hands its live holds back (adopt) from its poller thread while a
    request thread settles one of them: the two calls are not ordered, and a settle that landed
    first used to be undone by the adopt (a slot held forever, a drain waiting for it)."""
    cp = _plane()
    q = QuotaView(max_concurrent=2)
    cp.settle("k1", 5)  # reaches the new instance first
    assert cp.adopt([HeldReservation("k1", "t", 10, None), HeldReservation("k2", "t", 10, None)], "ing") == 1
    assert cp.running("t") == 1 and cp.live_reservations() == 1  # k2 only
    assert isinstance(_reserve(cp, q, 1), Hold)  # the second slot is free
    assert isinstance(_reserve(cp, q, 1), Refusal)


def test_a_cancel_that_lands_before_its_reserve_leaves_nothing_held():
    """An ingress whose reserve timed out sends a cancel after it; if the cancel lands first, the
    late reserve must not hold (nobody would ever settle it)."""
    cp = _plane()
    q = QuotaView(max_concurrent=1)
    cp.cancel("late")
    refused = _refused(_reserve(cp, q, 5, key="late"))
    assert refused.code == "request_cancelled"
    assert cp.running("t") == 0 and cp.live_reservations() == 0
    assert isinstance(_reserve(cp, q, 5), Hold)  # the one slot is still free


def test_holds_released_by_a_lapsed_lease_are_handed_back_by_the_adopt():
    """A lease's expiry is not an end: the stalled ingress's live holds come back with its adopt
    (only settles and cancels are remembered as ended)."""
    cp = _plane()
    q = QuotaView(max_concurrent=3)
    _held(_reserve(cp, q, 5, key="a1", owner="ing"))
    cp.holds._release("a1", 0)  # as expire_leases does for a silent ingress
    assert cp.live_reservations() == 0
    assert cp.adopt([HeldReservation("a1", "t", 5, None)], "ing") == 1
    assert cp.live_reservations() == 1
