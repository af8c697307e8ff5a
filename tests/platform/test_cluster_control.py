"""The control-plane actor's logic, driven as a plain object (Ray only makes it remote): quota
reservations keyed for remote callers, the versioned desired engine state replicas pull, and the
replica registry that forgets silent replicas."""

from __future__ import annotations

import time

import pytest

from loraplex.platform.cluster.control import ControlPlane, raise_refusal
from loraplex.platform.errors import RateLimited
from loraplex.platform.quotas.store import QuotaView


def test_reservations_by_key_are_exact_and_refunds_work():
    cp = ControlPlane("sqlite://")
    q = QuotaView(rpm=3, tpm=100, max_concurrent=2)
    a, b = cp.reserve("t", q, 30), cp.reserve("t", q, 30)
    assert "key" in a and "key" in b and a["key"] != b["key"]
    refused = cp.reserve("t", q, 30)["refused"]  # the concurrency cap of 2
    assert refused["message"].startswith("too many concurrent requests")
    with pytest.raises(RateLimited) as exc:
        raise_refusal(refused)
    assert exc.value.headers["retry-after"] == "1" and exc.value.code == "rate_limit_exceeded"
    assert cp.running("t") == 2
    cp.cancel(a["key"])  # refused after reserving: the rpm slot comes back too
    cp.settle(b["key"], 10)  # served 10 of the 30 held
    cp.settle(b["key"], 10)  # a second settle of the same key changes nothing
    assert cp.running("t") == 0
    c = cp.reserve("t", q, 90)  # tpm window holds 10 (b as served), so 90 fits exactly
    assert "key" in c and c["headers"]["x-ratelimit-remaining-tokens"] == "0"
    assert cp.reserve("t", q, 1)["refused"]["message"].startswith("rate limit reached: 100 tokens")
    assert cp.precheck("t", q) is None  # rpm: 2 of 3 used (a was refunded)


def test_state_is_versioned_and_only_changes_bump_it():
    cp = ControlPlane("sqlite://")
    assert cp.state(-1) == {"version": 0, "tenants": {}, "adapters": {}}
    v1 = cp.set_tenant("t", 0, 1.0, None)
    assert cp.set_tenant("t", 0, 1.0, None) == v1  # the same value again is no change
    v2 = cp.add_adapter("ad", "/store/ad")
    assert v2 == v1 + 1 and cp.state(v2) is None  # an up-to-date replica gets nothing
    v3 = cp.remove_adapter("ad")
    assert v3 == v2 + 1 and cp.remove_adapter("ad") == v3
    assert cp.state(v1) == {"version": v3, "tenants": {"t": (0, 1.0, None)}, "adapters": {}}


def test_replicas_that_stop_reporting_are_forgotten():
    cp = ControlPlane("sqlite://", replica_ttl_s=0.2)
    cp.report("engine-a", {"pid": 1})
    cp.report("engine-b", {"pid": 2})
    assert [r["replica"] for r in cp.replicas()] == ["engine-a", "engine-b"]
    time.sleep(0.3)
    cp.report("engine-b", {"pid": 2})
    assert [r["pid"] for r in cp.replicas()] == [2]
    cp.forget("engine-b")
    assert cp.replicas() == []
