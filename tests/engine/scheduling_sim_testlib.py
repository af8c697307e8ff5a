"""The cost-model scheduling simulator shared by the scheduling tests: the REAL Scheduler,
KVCacheManager and policies, with the network replaced by "a step takes a + b·tokens seconds" and a
fake token appended per sample (``Sim``), and Poisson arrivals (``poisson``). Used by
test_scheduling_sim.py (one replica) and test_fair_global.py (two replicas exchanging service)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from loraplex.engine.config import SchedulerConfig
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.policies import make_policy
from loraplex.engine.runner_output import RunnerOutput
from loraplex.engine.sampling_params import SamplingParams
from loraplex.engine.scheduler import Scheduler
from loraplex.engine.sequence import AdapterRef, Request, Sequence, TenantInfo

# service weights the simulator charges: prompt tokens computed, output tokens sampled
W_P, W_Q = 1.0, 2.0


@dataclass
class Arrival:
    t: float
    tenant: str
    prompt_len: int
    max_tokens: int
    adapter: str | None = None


def poisson(
    tenant: str,
    rate: float,
    t_end: float,
    rng: random.Random,
    prompt=(16, 64),
    output=(16, 128),
    t_start: float = 0.0,
    adapter=None,
) -> list[Arrival]:
    out, t = [], t_start
    while True:
        t += rng.expovariate(rate)
        if t >= t_end:
            return out
        a = adapter(rng) if callable(adapter) else adapter
        out.append(Arrival(t, tenant, rng.randint(*prompt), rng.randint(*output), a))


class Sim:
    """Drives the real scheduler step (schedule -> update_from_output) with a fake model output."""

    def __init__(
        self,
        policy: str,
        arrivals: list[Arrival],
        tenants: dict[str, TenantInfo] | None = None,
        num_blocks=64,
        block_size=16,
        max_num_seqs=16,
        max_num_batched_tokens=256,
        step_base=0.010,
        step_per_token=0.0002,
        **cfg,
    ):
        self.config = SchedulerConfig(
            scheduling_policy=policy,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            vtc_prompt_weight=W_P,
            vtc_output_weight=W_Q,
            **cfg,
        )
        self.kv = KVCacheManager(num_blocks, block_size, 0.0)
        self.policy = make_policy(self.config)
        self.sched = Scheduler(self.config, self.kv, self.policy)
        self.now = 0.0
        self.sched.clock = lambda: self.now
        self.step_base, self.step_per_token = step_base, step_per_token
        self.arrivals = sorted(arrivals, key=lambda a: a.t)
        self._next = 0
        self.tenants = tenants or {}
        self.service = defaultdict(float)  # tenant -> w_p·prompt tokens computed + w_q·output tokens
        self._prompt_hw: dict[int, int] = {}  # seq_id -> prompt tokens already counted (recompute is free)
        self.admitted_at: dict[int, float] = {}
        self.first_token_at: dict[int, float] = {}
        self.seqs: list[Sequence] = []
        self.steps = 0
        self.cold_admissions = 0  # admitted with an adapter the previous step did not run
        self._prev_adapters: set = set()

    def tenant(self, tid: str) -> TenantInfo:
        if tid not in self.tenants:
            self.tenants[tid] = TenantInfo(tid)
        return self.tenants[tid]

    def _arrive(self) -> None:
        while self._next < len(self.arrivals) and self.arrivals[self._next].t <= self.now:
            a = self.arrivals[self._next]
            self._next += 1
            req = Request(
                request_id=f"r{self._next}",
                prompt_token_ids=[1] * a.prompt_len,
                params=SamplingParams(max_tokens=a.max_tokens, ignore_eos=True),
                adapter=AdapterRef(a.adapter, 1, a.adapter) if a.adapter else None,
                tenant=self.tenant(a.tenant),
                arrival_time=a.t,
            )
            seq = Sequence(request=req, index=0, token_ids=[1] * a.prompt_len, num_prompt_tokens=a.prompt_len)
            req.sequences.append(seq)
            self.seqs.append(seq)
            self.sched.add(seq)

    def backlogged(self, tid: str) -> bool:
        return self.policy.book.num_waiting.get(tid, 0) > 0

    def step(self) -> None:
        self._arrive()
        out = self.sched.schedule()
        self.steps += 1
        if not out:
            nxt = self.arrivals[self._next].t if self._next < len(self.arrivals) else self.now + 1.0
            self.now = max(self.now + self.step_base, nxt)
            return
        for c in out.chunks:
            seq = c.seq
            if seq.seq_id not in self.admitted_at and seq.adapter is not None:
                self.cold_admissions += seq.adapter not in self._prev_adapters
            self.admitted_at.setdefault(seq.seq_id, self.now)
            end = min(seq.num_computed_tokens + c.num_tokens, seq.num_prompt_tokens)
            new = end - self._prompt_hw.get(seq.seq_id, 0)
            if new > 0:
                self._prompt_hw[seq.seq_id] = end
                self.service[seq.tenant.tenant_id] += W_P * new
        self._prev_adapters = out.adapters
        self.now += self.step_base + self.step_per_token * out.num_tokens
        result = RunnerOutput(sampled=[(seq, [1]) for seq in out.sampling_targets])
        for seq in self.sched.update_from_output(out, result):
            self.first_token_at.setdefault(seq.seq_id, self.now)
            self.service[seq.tenant.tenant_id] += W_Q

    def run(self, steps: int, each=None) -> None:
        for _ in range(steps):
            self.step()
            if each is not None:
                each(self)
