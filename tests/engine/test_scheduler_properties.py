"""Scheduler invariants over random workloads (hypothesis), driving the REAL scheduler step —
``schedule()`` then ``update_from_output()`` with a fake model output — no model needed.

Every step, whatever the policy, budget, pool size, adapters, n > 1 forks, prefix caching and aborts:
  * the step's tokens fit the token budget, its sequences fit max_num_seqs, and it uses at most
    max_loras distinct adapters;
  * every sequence is in exactly one place: waiting, running, a not-yet-forked follower, or finished;
  * KV blocks are conserved: refcounts equal the block tables' references, free = unreferenced,
    and when everything is done every block is free again;
  * nothing is lost: every request ends, with as many tokens as it asked for (no EOS here).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.outputs import FinishReason
from loraplex.engine.policies import make_policy
from loraplex.engine.runner_output import RunnerOutput
from loraplex.engine.sampling_params import SamplingParams
from loraplex.engine.scheduler import Scheduler
from loraplex.engine.sequence import AdapterRef, Request, Sequence, SequenceStatus, TenantInfo

request_st = st.fixed_dictionaries(
    {
        "step": st.integers(0, 30),
        "prompt": st.integers(1, 40),
        "max_tokens": st.integers(1, 12),
        "adapter": st.sampled_from([None, None, "a", "b", "c", "d"]),
        "tenant": st.sampled_from(["t1", "t2", "t3"]),
        "n": st.sampled_from([1, 1, 1, 2, 3]),
        "shared_prefix": st.booleans(),
        "abort_after": st.one_of(st.none(), st.integers(0, 20)),
    }
)


def check_invariants(sched: Scheduler, kv: KVCacheManager, seqs: list[Sequence]) -> None:
    running = {s.seq_id for s in sched.running}
    waiting = {s.seq_id for s in sched.policy.waiting()}
    followers = {s.seq_id for fs in sched._followers.values() for s in fs}
    for s in seqs:
        places = [s.seq_id in running, s.seq_id in waiting, s.seq_id in followers, s.is_finished]
        assert sum(places) == 1, (s.seq_id, s.status, places)
        assert (s.status is SequenceStatus.RUNNING) == (s.seq_id in running)
    assert len(sched.running) == len(running), "a sequence runs twice"
    pool = kv.pool
    refs = [0] * pool.num_blocks
    for table in kv.block_tables.values():
        for b in table:
            refs[b] += 1
    assert refs == pool.refcounts, "block refcounts drifted from the block tables"
    assert pool.num_free == sum(1 for r in refs if r == 0)
    assert {sid for sid, table in kv.block_tables.items() if table} <= running, (
        "a sequence that does not run holds blocks"
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(["fcfs", "priority", "fair", "sjf"]),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(1, 48),
    max_loras=st.integers(1, 3),
    num_blocks=st.integers(12, 48),
    block_size=st.sampled_from([2, 4, 8]),
    prefix_caching=st.booleans(),
    requests=st.lists(request_st, min_size=1, max_size=14),
    seed=st.integers(0, 2**16),
)
def test_scheduler_invariants_hold_on_random_workloads(
    policy, max_num_seqs, budget, max_loras, num_blocks, block_size, prefix_caching, requests, seed
):
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        scheduling_policy=policy,
        max_loras=max_loras,
        priority_aging_s=0.0,
    )
    kv = KVCacheManager(num_blocks, block_size, 0.0, enable_prefix_caching=prefix_caching)
    sched = Scheduler(config, kv, make_policy(config), max_model_len=10_000)
    clock = [0.0]
    sched.clock = lambda: clock[0]
    rng = random.Random(seed)
    tenants = {t: TenantInfo(t, priority=i % 2, weight=1.0 + i) for i, t in enumerate(["t1", "t2", "t3"])}
    pending = sorted(enumerate(requests), key=lambda x: x[1]["step"])
    reqs: list[tuple[Request, dict]] = []
    seqs: list[Sequence] = []
    for step in range(400):
        clock[0] += 0.01
        while pending and pending[0][1]["step"] <= step:
            i, spec = pending.pop(0)
            prompt_len = spec["prompt"]
            if -(-(prompt_len + spec["max_tokens"]) // block_size) > kv.usable_blocks or spec["n"] > max_num_seqs:
                continue  # the engine refuses these at admission (checked elsewhere)
            prompt = ([7] * prompt_len) if spec["shared_prefix"] else [rng.randrange(100) for _ in range(prompt_len)]
            adapter = AdapterRef(spec["adapter"], 1, spec["adapter"]) if spec["adapter"] else None
            req = Request(
                request_id=f"r{i}",
                prompt_token_ids=prompt,
                params=SamplingParams(n=spec["n"], max_tokens=spec["max_tokens"], ignore_eos=True),
                adapter=adapter,
                tenant=tenants[spec["tenant"]],
                arrival_time=clock[0],
            )
            for k in range(spec["n"]):
                req.sequences.append(
                    Sequence(request=req, index=k, token_ids=list(prompt), num_prompt_tokens=prompt_len)
                )
            sched.add_forked(req.sequences[0], req.sequences[1:])
            reqs.append((req, {**spec, "arrived": step}))
            seqs.extend(req.sequences)
        for req, spec in reqs:  # aborts, as the engine applies them between steps
            if spec["abort_after"] is not None and step == spec["arrived"] + spec["abort_after"]:
                for s in req.sequences:
                    if not s.is_finished:
                        sched.finish(s, FinishReason.ABORT)
        plan = sched.schedule()
        check_invariants(sched, kv, seqs)
        assert plan.num_tokens <= budget
        assert len(sched.running) <= max_num_seqs
        assert len(plan.adapters) <= max_loras
        assert len({c.seq.seq_id for c in plan.chunks}) == len(plan.chunks), "a sequence scheduled twice"
        sched.update_from_output(plan, RunnerOutput(sampled=[(s, [rng.randrange(100)]) for s in plan.sampling_targets]))
        check_invariants(sched, kv, seqs)
        assert len(sched.running) <= max_num_seqs, "forks overfilled the batch"
        if not pending and not sched.has_work() and not sched._followers:
            break
    assert not pending and not sched.has_work(), "the workload did not drain"
    for req, spec in reqs:
        for s in req.sequences:
            assert s.is_finished
            if s.finish_reason is FinishReason.LENGTH:
                assert s.num_output_tokens == spec["max_tokens"]
            else:
                assert s.finish_reason is FinishReason.ABORT
    assert kv.num_free_blocks == kv.num_blocks and not any(kv.block_tables.values())
