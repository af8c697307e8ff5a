"""Fair-share preemption on the real engine (tiny model), counted in engine steps: a light tenant's
request that arrives while two flooding tenants fill every batch slot gets its first token within a
few steps (a flood sequence gives way and is recomputed); without share preemption it waits for a
flood sequence to finish. The preempted sequences' greedy tokens equal an unpreempted run's, and
the hysteresis holds (no victim that just started, one preempting request per step, no ping-pong)."""

from __future__ import annotations

import random

from loraplex.engine import SamplingParams
from loraplex.engine.config import EngineConfig
from loraplex.engine.llm_engine import LLMEngine
from loraplex.engine.policies import FairPolicy, TenantLimits
from loraplex.engine.sequence import Request, Sequence, TenantInfo

FLOOD_TOKENS = 120  # each flood sequence would hold its slot this many steps
MIN_RUN = 4


def engine(model: str, share: bool, **kw) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=model,
            scheduling_policy="fair",
            max_num_seqs=8,
            block_size=8,
            num_kv_blocks=kw.pop("num_kv_blocks", 400),  # slots, not KV, are the limit
            kernel_backend="torch",
            dtype="float32",
            fair_share_preemption=share,
            preemption_min_run_steps=MIN_RUN,
            **kw,
        )
    )


def flood_then_light(model: str, share: bool, light: bool = True) -> tuple[LLMEngine, int | None, dict]:
    """F1 and F2 queue 6 long greedy requests each at step 0 (8 run, 4 wait); L sends one short
    request at step 20. Returns the engine, L's first-token step counted from its arrival (1 = the
    step it arrived in), and every request's final output."""
    e = engine(model, share)
    rng = random.Random(0)
    vocab = e.model_config.vocab_size
    flood = SamplingParams(max_tokens=FLOOD_TOKENS, temperature=0.0, ignore_eos=True)
    for _ in range(6):
        for tenant in ("F1", "F2"):
            e.add_request([rng.randrange(5, vocab) for _ in range(10)], flood, tenant_id=tenant)
    light_id, first, done = None, None, {}
    for step in range(3 * FLOOD_TOKENS):
        if light and step == 20:
            light_id = e.add_request(
                [rng.randrange(5, vocab) for _ in range(10)],
                SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                tenant_id="L",
            ).request_id
        for out in e.step():
            if out.request_id == light_id and first is None:
                first = step - 20 + 1
            if out.finished:
                done[out.request_id] = out
        if not e.has_unfinished_requests():
            break
    return e, first, done


def test_light_request_gets_a_slot_within_a_few_steps_of_arrival_under_a_two_tenant_flood(tiny_llama):
    on, first_on, _ = flood_then_light(tiny_llama, share=True)
    off, first_off, _ = flood_then_light(tiny_llama, share=False)
    # With share preemption: one flood sequence gives way at once (all have run for 20 steps).
    assert first_on is not None and first_on <= 2, first_on
    assert on.stats()["scheduler"]["admission_preemptions"] == 1
    # Without it (two flooders: the single-tenant batch-hog rule does not apply) L waits for a flood
    # sequence to finish: ~100 more steps.
    assert first_off is not None and first_off > FLOOD_TOKENS // 2, first_off
    assert off.counters["preemptions"] == 0


def test_preempted_flood_sequences_resume_with_the_same_greedy_tokens(tiny_llama):
    e, _, with_light = flood_then_light(tiny_llama, share=True)
    ref, _, alone = flood_then_light(tiny_llama, share=True, light=False)
    assert ref.counters["preemptions"] == 0  # nobody waits below its share: nothing is preempted
    preempted = [out for out in with_light.values() if out.metrics["num_preemptions"] > 0]
    assert len(preempted) == 1 and preempted[0].tenant_id != "L"
    by_prompt = {tuple(out.prompt_token_ids): out for out in alone.values()}  # same seed: same prompts
    flood = [out for out in with_light.values() if out.tenant_id != "L"]
    assert len(flood) == len(by_prompt) == 12
    for out in flood:
        got = out.outputs[0].token_ids
        assert len(got) == FLOOD_TOKENS
        # the preempted one is recomputed from its prompt + the tokens it had: nothing changes
        assert got == by_prompt[tuple(out.prompt_token_ids)].outputs[0].token_ids


def test_hysteresis_no_young_victim_one_preemptor_per_step_and_no_ping_pong(tiny_llama):
    """Two flooders keep 16 requests queued (closed loop); L sends bursts of 3 short requests every
    9 steps. Every sequence that leaves the batch unfinished had run >= MIN_RUN steps since it
    (re)started; each step preempts for at most one waiting request (slots are the only limit, so
    one victim each); only flood sequences give way, and at most once per light request."""
    e = engine(tiny_llama, share=True)
    rng = random.Random(1)
    vocab = e.model_config.vocab_size
    params = {
        "F1": SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
        "F2": SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
        "L": SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
    }
    tenant_of: dict[str, str] = {}

    def add(tenant: str) -> None:
        req = e.add_request([rng.randrange(5, vocab) for _ in range(10)], params[tenant], tenant_id=tenant)
        tenant_of[req.request_id] = tenant

    for _ in range(8):
        add("F1")
        add("F2")
    sched = e.scheduler
    started: dict[int, int] = {}
    light_sent = victims = 0
    last_count = 0
    for step in range(400):
        if step % 9 == 3:
            for _ in range(3):
                add("L")
                light_sent += 1
        before = {s.seq_id: s for s in sched.running}
        for out in e.step():
            if out.finished and tenant_of[out.request_id] != "L":
                add(tenant_of[out.request_id])  # closed loop: the flood never drains
        now_running = {s.seq_id for s in sched.running}
        for sid, seq in before.items():
            if sid not in now_running and not seq.is_finished:  # preempted this step
                assert seq.tenant.tenant_id in ("F1", "F2"), seq.tenant.tenant_id
                assert sched.step_count - started[sid] >= MIN_RUN, (sid, started[sid], sched.step_count)
                victims += 1
        for s in sched.running:
            if s.seq_id not in before:
                started[s.seq_id] = sched.step_count
        count = sched.admission_preemption.preemptions
        assert count - last_count <= 1  # one waiting request per step, one slot each
        last_count = count
    assert victims == sched.admission_preemption.preemptions > 0
    assert victims <= light_sent  # each light request pushes out at most one flood sequence
    assert e.counters["preemptions"] == victims  # no KV preemptions in this setup: all are for fairness


def _seq(tid: str, i: int, t: float, priority: int = 0) -> Sequence:
    req = Request(
        request_id=f"{tid}{i}",
        prompt_token_ids=[1] * 8,
        params=SamplingParams(max_tokens=4),
        tenant=TenantInfo(tid, priority=priority),
        arrival_time=t,
    )
    seq = Sequence(request=req, index=0, token_ids=[1] * 8, num_prompt_tokens=8)
    req.sequences.append(seq)
    return seq


def test_share_preemption_also_when_the_kv_cache_is_the_cap():
    """The scheduler asks only when the batch is at a cap. With 6 of 8 slots used (the KV cache is
    full), shares are of the 6 running sequences (2 each for F, M, L): the flooder F (5 running)
    names its newest 3, so it keeps its share whatever the scheduler takes; a tenant at or above
    its share names nobody; a tenant ahead on its counter names nobody."""
    policy = FairPolicy(TenantLimits(max_num_seqs=8))
    running = [_seq("F", i, float(i)) for i in range(5)] + [_seq("M", 0, 0.5)]
    for s in running:
        policy.on_admitted(s, 8)
    light = _seq("L", 0, 10.0)
    policy.add_waiting(light)
    policy.counters.update(F=100.0, M=10.0, L=10.0)
    victims = policy.preemption_candidates(light, running, 11.0)
    assert [v.request.request_id for v in victims] == ["F4", "F3", "F2"]
    more_f = _seq("F", 9, 12.0)
    policy.add_waiting(more_f)
    assert policy.preemption_candidates(more_f, running, 13.0) == []  # F is above its share
    policy.counters["L"] = 150.0  # L served more than F lately: VTC order, no preemption
    assert policy.preemption_candidates(light, running, 14.0) == []


def test_n_greater_than_one_under_kv_pressure_keeps_greedy_outputs(tiny_llama):
    """Hostile mix: both flooders send n=2 requests (followers share the leader's blocks), light
    requests are n=3, and the KV cache (40 blocks) is the cap, so share preemptions of forked
    sequences mix with KV preemptions. Every request completes and every flood sample's greedy
    tokens equal a run without the light tenant."""

    def run(light: bool) -> tuple[LLMEngine, dict]:
        e = engine(tiny_llama, share=True, num_kv_blocks=40)
        rng = random.Random(0)
        vocab = e.model_config.vocab_size
        flood = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True, n=2)
        for _ in range(4):
            for tenant in ("F1", "F2"):
                e.add_request([rng.randrange(5, vocab) for _ in range(30)], flood, tenant_id=tenant)
        done = {}
        for step in range(2000):
            if light and step % 7 == 3 and step < 200:
                params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, n=3)
                e.add_request([rng.randrange(5, vocab) for _ in range(12)], params, tenant_id="L")
            for out in e.step():
                if out.finished:
                    done[out.request_id] = out
            if not e.has_unfinished_requests():
                break
        return e, done

    e, with_light = run(True)
    _, alone = run(False)
    assert e.stats()["scheduler"]["admission_preemptions"] > 0
    light = [o for o in with_light.values() if o.tenant_id == "L"]
    assert len(light) == 29 and all(len(c.token_ids) == 5 for o in light for c in o.outputs)
    ref = {tuple(o.prompt_token_ids): [c.token_ids for c in o.outputs] for o in alone.values()}
    flood = [o for o in with_light.values() if o.tenant_id != "L"]
    assert len(flood) == len(ref) == 8
    for o in flood:
        assert [c.token_ids for c in o.outputs] == ref[tuple(o.prompt_token_ids)]
