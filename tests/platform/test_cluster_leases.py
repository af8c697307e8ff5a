"""The control plane's ingress leases on a real local Ray: a silent ingress keeps its holds while it
lives and loses them once its process is gone.

Real processes: the control plane is the Ray actor ``deploy.py`` makes, each "ingress" is a Ray actor
process named as Serve names its replicas, holding an ``ActorQuotaStore`` and ticking ``snapshot``
under that name, as the Serve ingress does. The stall is a real ``SIGSTOP`` of ingress A's process and the death a real
``SIGKILL``; nothing is faked. What would break: releasing on silence alone (the old rule) lets B
admit while A is stopped with two requests running — the cap of 2 exceeded, as a whole-suite run
beside CPU burners once showed on the cluster (6 running at ``max_concurrent=3``); never releasing
leaves the dead A's slots held forever."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness.wait import wait_for

ray = pytest.importorskip("ray", reason="the lease tests need loraplex[ray]")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LEASE_S = 2.0
PREFIX = "lease-test#ingress#"  # the test's ingress actors are named like Serve's (deploy.py)
WAIT_S = 180  # bounds a wait on a loaded 2-core box; nothing here measures time


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    env = os.environ.pop("RAY_ADDRESS", None)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        namespace="loraplex-lease-test",
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    yield
    ray.shutdown()
    if env is not None:
        os.environ["RAY_ADDRESS"] = env


@pytest.fixture(autouse=True)
def _no_named_actor_left(local_ray):
    """After each test, its named ingress actors are killed and their names free again. A failed
    test's traceback keeps its actor handles alive (pytest holds it for the report), so the next
    test's ``_ingress(control, "a")`` met a name still taken: one failure beside CPU burners showed
    as five."""
    yield
    for name in [n for n in ray.util.list_named_actors() if n.startswith(PREFIX)]:
        try:
            ray.kill(ray.get_actor(name), no_restart=True)
        except ValueError:  # gone meanwhile
            pass
    deadline = time.monotonic() + WAIT_S
    while any(n.startswith(PREFIX) for n in ray.util.list_named_actors()):
        assert time.monotonic() < deadline, ray.util.list_named_actors()
        time.sleep(0.1)


@ray.remote(num_cpus=0)
class Ingress:
    """What the Serve ingress does with the control plane, and nothing else."""

    def __init__(self, control, name: str) -> None:
        from loraplex.platform.cluster.quota_store import ActorQuotaStore

        self.control, self.name = control, name
        # the test's patience, not the product's 60 s: beside CPU burners a control-plane restart
        # (a new worker process importing loraplex) took longer than that, and the admit became
        # a 503 while what the test asks (who is admitted, who refused) was still to come
        self.store = ActorQuotaStore(control, owner=name, retry_budget_s=WAIT_S)
        self.held: list = []

    def pid(self) -> int:
        return os.getpid()

    def tick(self):
        snap = ray.get(self.control.snapshot.remote(self.name, len(self.held), 0))
        self.store.saw_epoch(snap.epoch, readopt=snap.readopt)  # as the ingress's poller
        return snap

    def start_polling(self, interval_s: float) -> None:
        """The ingress's poller: a snapshot every ``interval_s`` in a thread of its own."""
        import threading

        from loraplex.platform.cluster.actor_calls import call_actor

        def poll() -> None:
            while True:
                try:
                    snap = call_actor(lambda: self.control.snapshot.remote(self.name, len(self.held), 0))
                    self.store.saw_epoch(snap.epoch, readopt=snap.readopt)
                except Exception:  # noqa: BLE001 - the control plane restarting: next tick
                    pass
                time.sleep(interval_s)

        threading.Thread(target=poll, daemon=True).start()

    def finish_all(self) -> None:
        """Every request held ends: its hold settled (as a finished request's ingress does)."""
        while self.held:
            self.store.settle(self.held.pop(), 10)

    def lose_one(self) -> None:
        """A request ends but its settle never reaches the control plane (a leaked hold): the
        ingress no longer counts it in flight, the control plane still holds it."""
        res = self.held.pop()
        with self.store._lock:  # forgotten here without telling the actor
            self.store._live.pop(res.key, None)

    def admit(self, limit: int) -> str:
        from loraplex.platform.errors import RateLimited
        from loraplex.platform.quotas.store import QuotaView

        try:
            self.held.append(self.store.reserve("tenant", QuotaView(max_concurrent=limit), 10))
            return "admitted"
        except RateLimited as exc:
            return str(exc)


def _ingress(control, name: str):
    """An ingress actor named as Serve names its replicas' actors, which the control plane lists."""
    return Ingress.options(name=PREFIX + name).remote(control, PREFIX + name)


def _restart(control) -> None:
    """Kill the control actor (Ray restarts it) and return once a NEW instance answers: ``ray.kill``
    returns before the old one is gone, and a call sent meanwhile may still reach it. The version
    is milliseconds since the epoch at an instance's start, so the new one's differs."""
    old = ray.get(control.state.remote(-1)).version
    ray.kill(control, no_restart=False)
    deadline = time.monotonic() + WAIT_S
    while ray.get(control.state.remote(-1)).version == old:
        assert time.monotonic() < deadline, "the control actor was not restarted"
        time.sleep(0.05)


def _control(**kw):
    from loraplex.platform.cluster.control import ControlConfig, ControlPlane

    # the options deploy.py gives it (one call at a time; no database needed for quotas)
    return (
        ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(ControlPlane)
        .options(max_concurrency=1)
        .remote(ControlConfig("sqlite://", ingress_lease_s=LEASE_S, ingress_prefix=PREFIX, **kw))
    )


def _a_holds_two_of_two():
    """A control plane that waits for two ingresses after a restart; ingress A holds both slots of
    a cap of 2 and polls every 0.5 s as the real ingress does (sync_interval_s in the cluster
    tests); B is registered and holds nothing. Returns (control, a, b)."""
    control = _control(expected_ingresses=2)
    a, b = _ingress(control, "a"), _ingress(control, "b")
    ray.get([a.tick.remote(), b.tick.remote()])
    assert ray.get([a.admit.remote(2), a.admit.remote(2)]) == ["admitted", "admitted"]
    ray.get(a.start_polling.remote(0.5))
    return control, a, b


def test_a_stopped_ingress_keeps_its_holds_and_a_killed_one_loses_them(local_ray):
    control = _control()
    a, b = _ingress(control, "a"), _ingress(control, "b")
    ray.get([a.tick.remote(), b.tick.remote()])  # both hold leases
    assert ray.get([a.admit.remote(2), a.admit.remote(2)]) == ["admitted", "admitted"]
    assert ray.get(b.admit.remote(2)).startswith("too many concurrent requests")
    pid_a = ray.get(a.pid.remote())

    os.kill(pid_a, signal.SIGSTOP)  # A lives (Ray still lists it) but says nothing
    try:
        # B keeps ticking for many leases; every tick runs the expiry, and A's holds must stay
        ticks = 0
        start = time.monotonic()
        while time.monotonic() - start < 5 * LEASE_S or ticks < 20:
            ray.get(b.tick.remote())
            ticks += 1
            time.sleep(0.1)
        assert ray.get(control.running.remote("tenant")) == 2
        assert ray.get(b.admit.remote(2)).startswith("too many concurrent requests")
        assert ray.get(b.tick.remote()).control.released_by_lease == 0
    finally:
        os.kill(pid_a, signal.SIGCONT)
    # A answers again: nothing was released, so nothing is re-adopted (no readopt), holds intact
    assert ray.get(a.tick.remote()).readopt is False
    assert ray.get(control.running.remote("tenant")) == 2

    os.kill(pid_a, signal.SIGKILL)  # now gone: Ray confirms the death, the slots come back
    deadline = time.monotonic() + WAIT_S
    while ray.get(b.admit.remote(2)) != "admitted":
        assert time.monotonic() < deadline, "the killed ingress's holds were never released"
        ray.get(b.tick.remote())
        time.sleep(0.2)
    snap = ray.get(b.tick.remote())
    assert snap.control.released_by_lease == 2 and snap.control.ingresses == [PREFIX + "b"]
    assert ray.get(b.admit.remote(2)) == "admitted"  # both of the dead ingress's slots, no more
    assert ray.get(b.admit.remote(2)).startswith("too many concurrent requests")


def test_a_restarted_control_plane_admits_no_limited_hold_before_the_ingresses_hand_theirs_back(local_ray):
    """Ingress A holds 2 of 2 slots; the control actor is killed and Ray restarts it empty. B's
    admission reaches the new instance first (A learns of it only at its next poll): it must wait
    until A has handed its two holds back, then be refused. The old instance-blind answer admitted B
    at once: 3 running at a cap of 2."""
    control = _control(expected_ingresses=2)
    a, b = _ingress(control, "a"), _ingress(control, "b")
    ray.get([a.tick.remote(), b.tick.remote()])
    assert ray.get([a.admit.remote(2), a.admit.remote(2)]) == ["admitted", "admitted"]
    epoch = ray.get(b.tick.remote()).epoch
    ray.get(a.start_polling.remote(0.5))  # the real ingress's sync_interval_s in the cluster tests
    ray.kill(control, no_restart=False)  # Ray restarts it (max_restarts=-1), as after a crash
    assert ray.get(b.admit.remote(2)).startswith("too many concurrent requests")
    snap = ray.get(b.tick.remote())
    assert snap.epoch != epoch  # it was a new instance that answered
    assert ray.get(control.running.remote("tenant")) == 2  # A's two, adopted; nothing more
    # the adopted holds count: a cap of 3 admits exactly one more
    assert ray.get(b.admit.remote(3)) == "admitted"
    assert ray.get(b.admit.remote(3)).startswith("too many concurrent requests")


def test_a_frozen_ingress_keeps_its_holds_through_a_control_plane_restart(local_ray):
    """Two faults at once (found by the hostile tester on a real cluster: 5 running at a cap of 3):
    A holds 2 of 2 and is frozen (SIGSTOP) when the control actor is killed. B's admission reaches
    the new instance, which has never seen A's holds: it must neither admit nor refuse while A,
    alive to Ray, has not handed them back — for longer than the count-based grace (10 s), which
    used to admit B — and be refused once A is resumed and has adopted its two."""
    control, a, b = _a_holds_two_of_two()
    pid_a = ray.get(a.pid.remote())
    os.kill(pid_a, signal.SIGSTOP)
    try:
        _restart(control)
        pending = b.admit.remote(2)
        ready, _ = ray.wait([pending], timeout=20)  # how long A stays frozen, not a measurement
        assert not ready, ray.get(ready[0])  # B neither admitted nor refused while A's holds are unknown
    finally:
        os.kill(pid_a, signal.SIGCONT)
    assert ray.get(pending).startswith("too many concurrent requests")
    assert ray.get(control.running.remote("tenant")) == 2


def test_a_restarted_control_plane_does_not_wait_for_an_ingress_started_after_it(local_ray):
    """Found by the hostile tester on a real cluster: an ingress killed with the control actor is
    replaced by Serve, and the restarted instance waited for the replacement's start-up (51 s on a
    busy box) before admitting any limited tenant — although an ingress created after the old
    instance died can hold none of its slots. Here: A holds 2 of 2 and is frozen when the actor is
    killed; C appears only after the new instance is up and never calls. Once A is resumed and has
    handed its two back, B's admission at a cap of 3 is admitted (3 running) without waiting for
    C. Waiting for every listed ingress kept B waiting until the store's 60 s budget ran out (a 503)."""
    control, a, b = _a_holds_two_of_two()
    pid_a = ray.get(a.pid.remote())
    os.kill(pid_a, signal.SIGSTOP)
    try:
        _restart(control)
        c = _ingress(control, "c")  # Serve's replacement: listed from now on, silent
        ray.get(c.pid.remote())
        deadline = time.monotonic() + WAIT_S
        while PREFIX + "c" not in (ray.get(b.tick.remote()).control.live_ingresses or []):
            assert time.monotonic() < deadline, "the control plane never listed C"
            time.sleep(0.2)
        pending = b.admit.remote(3)  # room for one more once A's two are back
    finally:
        os.kill(pid_a, signal.SIGCONT)
    ready, _ = ray.wait([pending], timeout=WAIT_S)
    assert ready, "B's admission still waits (for C, which holds nothing)"
    assert ray.get(pending) == "admitted"
    assert ray.get(control.running.remote("tenant")) == 3  # A's two, adopted, and B's
    ray.kill(c)


def test_a_restarted_control_plane_does_not_wait_for_an_ingress_that_never_held_anything(local_ray):
    """The same hostile scenario when Serve's replacement is listed BEFORE the new instance starts
    (a cluster re-run after the fix above: it was, and limited tenants waited 37 s again): the
    restarted instance waits only for the live ingresses recorded as holders. C is listed when the
    new instance starts, silent, and never held anything: once A's two are back, B is admitted at
    a cap of 3 without waiting for C (waiting for every ingress listed at the restart kept B
    waiting until the store's 60 s budget ran out: a 503)."""
    control, a, b = _a_holds_two_of_two()
    c = _ingress(control, "c")  # starting: listed, silent, holds nothing
    ray.get(c.pid.remote())
    _restart(control)  # C is listed when the new instance starts
    assert PREFIX + "c" in (ray.get(b.tick.remote()).control.live_ingresses or [])
    pending = b.admit.remote(3)
    ready, _ = ray.wait([pending], timeout=WAIT_S)
    assert ready, "B's admission still waits (for C, which never held anything)"
    assert ray.get(pending) == "admitted"
    assert ray.get(control.running.remote("tenant")) == 3
    ray.kill(c)


def test_the_drain_waits_for_requests_in_flight_and_not_for_a_leaked_hold(local_ray):
    """The driver's drain (``drain.py``) on SIGTERM: a CI run's driver was still draining 240 s after
    its last stream had ended (drain_timeout_s 600), waiting for a reservation no request held.
    Ingress A holds three; one is leaked (its request ended, its settle lost), two are in flight.
    The drain must not end while those two run, must end once they finish although the leaked hold
    is still there, and must name it. Waiting for reservations alone returned at the deadline with
    the leaked one "still running"; waiting for nothing ended before the settle."""
    import threading

    from loraplex.platform.cluster.drain import drain

    control = _control()
    a = _ingress(control, "a")
    ray.get(a.tick.remote())
    assert ray.get([a.admit.remote(5) for _ in range(3)]) == ["admitted"] * 3
    ray.get(a.lose_one.remote())
    ray.get(a.start_polling.remote(0.2))
    lines: list[str] = []
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(drain(control, WAIT_S, 0.2, say=lines.append)), daemon=True)
    t.start()
    wait_for(lambda: any("every ingress refuses" in line for line in lines), timeout=WAIT_S, what="the drain starting")
    time.sleep(3.0)  # longer than the drain's quiet period: a drain ignoring the two in flight ends here
    lines.append("TEST: the two requests in flight finish")
    ray.get(a.finish_all.remote())
    t.join(WAIT_S)
    assert not t.is_alive() and result == [0], (result, lines)
    finished = lines.index("TEST: the two requests in flight finish")
    leaked = [i for i, line in enumerate(lines) if "1 reservation(s) held by no request in flight" in line]
    assert leaked and leaked[0] > finished and PREFIX + "a" in lines[leaked[0]], lines
    assert ray.get(control.live_reservations.remote()) == 1  # the leaked hold was reported, not hidden
