"""Fairness across replicas (global VTC): two engines' real schedulers and fair policies, driven by
the cost-model simulator, exchanging each tenant's service every few steps as the scale-out's
replicas do through the control plane (``exchange_fair_service``).

Tenant F floods both replicas; tenant L is backlogged on replica A only. Per-replica counters
split A evenly, so F gets A/2 + B = 3/4 of the total and L 1/4. With the exchange, F's counter on
A carries what B served it, so L takes A until the two are even overall. The oracle is the
simulator's own count of the tokens each tenant was served, not the policy's counters."""

from __future__ import annotations

import random

from scheduling_sim_testlib import Sim, poisson


def _service(exchange_every: int | None, steps: int = 2400) -> tuple[float, float]:
    rng = random.Random(7)
    a = Sim("fair", poisson("F", 40.0, 90.0, rng) + poisson("L", 40.0, 90.0, rng))
    b = Sim("fair", poisson("F", 80.0, 90.0, rng))
    seen = {"a": {}, "b": {}}  # what each replica has charged of the other's service

    def exchange() -> None:
        for me, other, key in ((a, b, "a"), (b, a, "b")):
            theirs = other.policy.local_service()
            delta = {t: v - seen[key].get(t, 0.0) for t, v in theirs.items()}
            seen[key] = theirs
            me.policy.add_external_service(delta)

    for i in range(steps):
        a.step()
        b.step()
        if exchange_every and i % exchange_every == 0:
            exchange()
    return a.service["L"], a.service["F"] + b.service["F"]


def test_global_counters_give_the_one_replica_tenant_its_share_of_the_whole():
    light_local, flood_local = _service(None)
    light_global, flood_global = _service(10)
    assert light_local / flood_local < 0.45  # per replica: L gets about a third of F's total
    assert light_global / flood_global > 0.8  # global: close to even
    assert light_global > 1.5 * light_local


def test_policies_without_counters_ignore_external_service():
    rng = random.Random(1)
    sim = Sim("fcfs", poisson("F", 10.0, 5.0, rng))
    sim.policy.add_external_service({"F": 1e9})
    assert sim.policy.local_service() == {}
    sim.run(50)
    assert sim.service["F"] > 0
