"""``DrainWatch``: when the driver's drain may end (``platform/cluster/drain.py``), driven with an
injected clock. The real drain on a real Ray is in test_cluster_leases.py."""

from __future__ import annotations

from loraplex.platform.cluster.control import ControlConfig, ControlPlane
from loraplex.platform.cluster.drain import DrainWatch
from loraplex.platform.cluster.messages import DrainProgress, ReserveItem
from loraplex.platform.quotas.store import QuotaView


def test_no_reservation_left_ends_the_drain_at_once():
    assert DrainWatch(quiet_s=2).see(DrainProgress(0, 0, 1), now=0).done


def test_requests_in_flight_keep_the_drain_waiting_however_long():
    watch = DrainWatch(quiet_s=2)
    assert not any(watch.see(DrainProgress(3, 1, 2), now=t).done for t in range(0, 1000, 5))


def test_holds_with_nothing_in_flight_end_it_after_the_quiet_period_and_are_counted():
    watch = DrainWatch(quiet_s=2)
    assert not watch.see(DrainProgress(2, 0, 2), now=10).done
    assert not watch.see(DrainProgress(2, 0, 2), now=11.9).done
    verdict = watch.see(DrainProgress(2, 0, 2), now=12)
    assert verdict.done and verdict.orphans == 2


def test_a_request_seen_again_restarts_the_quiet_period():
    watch = DrainWatch(quiet_s=2)
    watch.see(DrainProgress(2, 0, 1), now=0)
    assert not watch.see(DrainProgress(2, 1, 1), now=1.5).done  # a tick that still counted one
    assert not watch.see(DrainProgress(2, 0, 1), now=3).done
    assert watch.see(DrainProgress(2, 0, 1), now=5).done


def test_no_ingress_reporting_says_nothing_about_the_holds():
    """With no ingress ticking (all restarting), a count of 0 in flight means no report, not idle."""
    watch = DrainWatch(quiet_s=2)
    assert not any(watch.see(DrainProgress(1, 0, 0), now=t).done for t in range(100))


def test_the_control_plane_reports_holds_by_owner_and_what_the_ingresses_count():
    cp = ControlPlane(ControlConfig("sqlite://"))
    q = QuotaView(max_concurrent=5)
    cp.reserve_many("ing-a", [ReserveItem("k1", "t", q, 1), ReserveItem("k2", "t", q, 1)])
    cp.reserve_many("", [ReserveItem("k3", "t", q, 1)])
    cp.snapshot("ing-a", 1, 0)
    assert cp.drain_progress() == DrainProgress(3, 1, 1, {"ing-a": 2, "": 1})
    cp.settle("k1", 1)
    cp.cancel("k3")
    assert cp.drain_progress() == DrainProgress(1, 1, 1, {"ing-a": 1})
