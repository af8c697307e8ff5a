"""Nested fairness (engine/policies/fair.py): a tenant's fair share split among its groups (the
platform's projects) by their weights, with the real Scheduler, KV cache manager and FairPolicy
driven step by step (``Sim``'s scheduler, a fake runner output). Service is counted in tokens the
scheduler served (w_p·prompt tokens computed + w_q·output tokens), never in time."""

from __future__ import annotations

from collections import defaultdict

import pytest
from scheduling_sim_testlib import W_P, W_Q, Sim

from loraplex.engine import FairGroup, InvalidRequestError
from loraplex.engine.runner_output import RunnerOutput
from loraplex.engine.sampling_params import SamplingParams
from loraplex.engine.sequence import GroupInfo, Request, Sequence, TenantInfo

PROMPT, OUTPUT = 16, 24


def _flood(sim: Sim, tenant: TenantInfo, group: GroupInfo | None, n: int) -> None:
    for i in range(n):
        req = Request(
            request_id=f"{tenant.tenant_id}-{group.key if group else '-'}-{i}",
            prompt_token_ids=[1] * PROMPT,
            params=SamplingParams(max_tokens=OUTPUT, ignore_eos=True),
            tenant=tenant,
            arrival_time=0.0,
            group=group,
        )
        seq = Sequence(request=req, index=0, token_ids=[1] * PROMPT, num_prompt_tokens=PROMPT)
        req.sequences.append(seq)
        sim.sched.add(seq)


def _who(seq: Sequence) -> str:
    return f"{seq.tenant.tenant_id}/{seq.request.group.key}" if seq.request.group else seq.tenant.tenant_id


def _run(sim: Sim, steps: int, served: dict[str, float], backlogged) -> int:
    """Step the real scheduler; count service per tenant/group while ``backlogged()`` holds."""
    counted = 0
    prompt_done: dict[int, int] = {}
    for _ in range(steps):
        if not backlogged():
            break
        out = sim.sched.schedule()
        assert out, "everyone is backlogged: a step must run"
        for c in out.chunks:
            end = min(c.seq.num_computed_tokens + c.num_tokens, c.seq.num_prompt_tokens)
            new = end - prompt_done.get(c.seq.seq_id, 0)
            if new > 0:
                prompt_done[c.seq.seq_id] = end
                served[_who(c.seq)] += W_P * new
        for seq in sim.sched.update_from_output(out, RunnerOutput(sampled=[(s, [1]) for s in out.sampling_targets])):
            served[_who(seq)] += W_Q
        counted += 1
    return counted


def test_two_projects_3_to_1_inside_a_tenant_and_the_other_tenant_keeps_its_share():
    sim = Sim("fair", [], max_num_seqs=8, num_blocks=256, max_num_batched_tokens=128)
    t1, t2 = TenantInfo("t1"), TenantInfo("t2")
    a, b = GroupInfo("prj_a", weight=3.0), GroupInfo("prj_b", weight=1.0)
    _flood(sim, t1, a, 400)
    _flood(sim, t1, b, 400)
    _flood(sim, t2, None, 800)
    waiting = lambda: sim.policy.waiting()  # noqa: E731

    def all_backlogged() -> bool:
        who = {_who(s) for s in waiting()}
        return {"t1/prj_a", "t1/prj_b", "t2"} <= who

    served: dict[str, float] = defaultdict(float)
    steps = _run(sim, 3000, served, all_backlogged)
    assert steps > 1000
    ab = served["t1/prj_a"] / served["t1/prj_b"]
    assert 2.7 < ab < 3.3, (ab, dict(served))  # the tenant's share split 3:1 by the projects' weights
    tenants = (served["t1/prj_a"] + served["t1/prj_b"]) / served["t2"]
    assert 0.9 < tenants < 1.1, (tenants, dict(served))  # t2 still gets its tenant share (1:1)


def test_groups_split_a_weighted_tenant_share_and_lower_group_priority_goes_first():
    sim = Sim("fair", [], max_num_seqs=8, num_blocks=256, max_num_batched_tokens=128)
    t1, t2 = TenantInfo("t1", weight=1.0), TenantInfo("t2", weight=3.0)
    a, b = GroupInfo("a", weight=1.0), GroupInfo("b", weight=1.0)
    _flood(sim, t1, a, 300)
    _flood(sim, t1, b, 300)
    _flood(sim, t2, None, 900)

    def all_backlogged() -> bool:
        return {"t1/a", "t1/b", "t2"} <= {_who(s) for s in sim.policy.waiting()}

    served: dict[str, float] = defaultdict(float)
    assert _run(sim, 2000, served, all_backlogged) > 800
    assert 0.9 < served["t1/a"] / served["t1/b"] < 1.1
    assert 2.7 < served["t2"] / (served["t1/a"] + served["t1/b"]) < 3.3

    # a group of better priority inside t1 is admitted before any more of t1's other groups
    urgent = GroupInfo("urgent", priority=0)
    a.priority = b.priority = 1
    others_waiting = sum(1 for s in sim.policy.waiting() if _who(s) in ("t1/a", "t1/b"))
    _flood(sim, t1, urgent, 40)
    _run(sim, 3000, served, lambda: any(_who(s) == "t1/urgent" for s in sim.policy.waiting()))
    assert not any(_who(s) == "t1/urgent" for s in sim.policy.waiting())
    assert sum(1 for s in sim.policy.waiting() if _who(s) in ("t1/a", "t1/b")) == others_waiting


def test_a_returning_group_banks_no_credit():
    sim = Sim("fair", [], max_num_seqs=4, num_blocks=256, max_num_batched_tokens=64)
    t1 = TenantInfo("t1")
    a, b = GroupInfo("a"), GroupInfo("b")
    _flood(sim, t1, a, 200)
    served: dict[str, float] = defaultdict(float)
    _run(sim, 300, served, lambda: True)
    assert served["t1/b"] == 0 and served["t1/a"] > 0
    _flood(sim, t1, b, 200)  # b arrives after a long idle time: lifted to a's counter
    policy = sim.policy
    assert policy.group_counters["t1", "b"] >= policy.group_counters["t1", "a"] - 1e-9
    after: dict[str, float] = defaultdict(float)
    _run(sim, 400, after, lambda: {"t1/a", "t1/b"} <= {_who(s) for s in sim.policy.waiting()})
    assert 0.8 < after["t1/b"] / after["t1/a"] < 1.25  # shares equally from here, no catch-up monopoly


@pytest.mark.parametrize("group", [FairGroup(""), FairGroup("p", weight=0.0), FairGroup("p", weight=float("nan"))])
def test_bad_fair_groups_are_refused(group):
    from loraplex.engine import EngineRequest
    from loraplex.engine.input_processor import _check_group

    with pytest.raises(InvalidRequestError):
        _check_group(EngineRequest([1, 2], fair_group=group))
