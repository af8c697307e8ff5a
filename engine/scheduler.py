"""Iteration-level (continuous) batching scheduler.

Each ``schedule()`` builds one step: running sequences first (decodes before unfinished prefills),
then new sequences from the policy, under four limits — the token budget, ``max_num_seqs``, free KV
blocks and ``max_loras`` distinct adapters. Prefills longer than the remaining budget are chunked.
When KV blocks run out, the policy names a victim whose blocks are freed; it is recomputed later.
A waiting request may also push running ones out (a better class, a tenant under its fair share):
the policy names who may give way, ``admission_preemption.py`` keeps that from thrashing.
``batching="static"`` forms a batch only when the previous one has fully drained (the baseline).
"""

from __future__ import annotations

import time
from collections import Counter

from .admission_preemption import AdmissionPreemptionGuard
from .config import SchedulerConfig
from .kv_cache import KVCacheManager
from .outputs import FinishReason
from .policies import SchedulingPolicy, TenantCaps, TenantLimits
from .runner_output import RunnerOutput
from .scheduler_output import ScheduledChunk, SchedulerOutput
from .sequence import Sequence, SequenceStatus

# A waiting request blocked by the adapter limit for this many steps freezes admission of other
# adapters until a slot frees for it, so it cannot starve behind a stream of resident adapters.
LORA_MAX_BLOCKED_STEPS = 16

# prefill_tokens_per_decode's room: a multiple of PROMPT_ROOM_QUANTUM tokens (a KV block of the
# default 16) and never below PROMPT_ROOM_MIN: smaller chunks run the GEMMs well below their rate
# and add a step to a prompt's TTFT per chunk.
PROMPT_ROOM_QUANTUM = 16
PROMPT_ROOM_MIN = 32


def prompt_room(decodes: int, waiting: int, per_decode: int) -> int | None:
    """How many prompt tokens a step carrying ``decodes`` decode rows may add while ``waiting``
    requests wait (None: no limit but the others): ``per_decode`` for each of them, rounded up to
    the quantum, at least PROMPT_ROOM_MIN. Every decoding stream waits for the step and every
    waiting request for its admission, so the prompt work a step carries grows with how many share
    the wait: at 3 each, beside 16 streams a 48-token chunk, beside 64 a 192-token one, and a burst
    of 64 arrivals is admitted 192 tokens a step however few decode yet. No decodes: no limit."""
    if not per_decode or not decodes:
        return None
    want = (decodes + waiting) * per_decode
    return max(PROMPT_ROOM_MIN, -(-want // PROMPT_ROOM_QUANTUM) * PROMPT_ROOM_QUANTUM)


class Scheduler:
    """Owns the step: ``schedule()`` plans it, ``update_from_output()`` books what it produced
    (computed KV, sampled tokens, forks, token-level stops, policy accounting). Text-level work —
    detokenizing, stop strings, outputs — belongs to the OutputProcessor."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        policy: SchedulingPolicy,
        *,
        max_model_len: int | None = None,
        eos_token_ids: frozenset[int] = frozenset(),
    ):
        self.config = config
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.kv = kv
        self.policy = policy
        self.running: list[Sequence] = []
        self.step_count = 0
        self._lora_blocked: dict[int, int] = {}  # seq_id -> first step it was blocked by max_loras
        self.clock = time.monotonic  # simulations swap in a virtual clock
        self.caps = TenantCaps(TenantLimits.from_config(config), kv, policy.book)
        self.admission_preemption = AdmissionPreemptionGuard(config.preemption_min_run_steps)
        # n > 1: samples 1..n-1 wait here, outside every queue, until sample 0 (the leader) has
        # prefilled the prompt; then they fork from it and share its blocks copy-on-write.
        self._followers: dict[int, list[Sequence]] = {}

    # ------------------------------------------------------------------ queue changes
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.policy.add_waiting(seq)

    def add_forked(self, leader: Sequence, followers: list[Sequence]) -> None:
        """Queue ``leader``; ``followers`` start from its prompt KV once it samples its first token."""
        self.add(leader)
        if followers:
            self._followers[leader.seq_id] = list(followers)

    def _fork(self, leader: Sequence, child: Sequence) -> None:
        """The leader just computed its prompt: the child joins the running set, sharing its blocks."""
        self._followers[leader.seq_id].remove(child)
        if not self._followers[leader.seq_id]:
            del self._followers[leader.seq_id]
        self.kv.fork(leader, child)
        child.num_computed_tokens = leader.num_computed_tokens
        child.num_cached_tokens = leader.num_cached_tokens
        child.status = SequenceStatus.RUNNING
        self.running.append(child)
        self.admission_preemption.started(child, self.step_count)
        self.policy.on_admitted(child, 0)  # the prompt was charged to the leader

    def finish(self, seq: Sequence, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        """Remove ``seq`` from wherever it is and free its blocks."""
        if seq.status is SequenceStatus.FINISHED:
            return
        leader_id = next((k for k, fs in self._followers.items() if seq in fs), None)
        if leader_id is not None:  # a follower not forked yet: it holds nothing
            self._followers[leader_id].remove(seq)
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason, seq.stop_reason = reason, stop_reason
            return
        for orphan in self._followers.pop(seq.seq_id, []):
            orphan.status = SequenceStatus.FINISHED
            orphan.finish_reason = reason
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.admission_preemption.stopped(seq)
        else:
            self.policy.remove_waiting(seq)
        self.kv.free(seq)
        self._lora_blocked.pop(seq.seq_id, None)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self.policy.on_finished(seq)

    def has_work(self) -> bool:
        return bool(self.running) or self.policy.num_waiting() > 0

    def is_stuck(self) -> bool:
        """Work waits, nothing runs, and the last plan was empty: nothing can ever be admitted."""
        return not self.running and self.policy.num_waiting() > 0

    # ------------------------------------------------------------------ the step plan
    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        self.step_count += 1
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens

        # 1. Running sequences, most important first; decodes before unfinished prefills.
        ordered = self.policy.order_running(self.running, now)
        queue = [s for s in ordered if s.in_decode] + [s for s in ordered if not s.in_decode]
        # While decodes share the step, each prompt adds at most `cap` tokens to it (a long prompt is
        # chunked, so the streams keep their pace). The cap is per prompt, not per step: prompts that
        # arrive together join one step (bounded by the budget) instead of one per step, which
        # would stall the running streams once per arrival and keep later arrivals staggered.
        cap = self.config.max_prefill_tokens_with_decodes
        chunk_cap = cap if cap is not None and queue and queue[0].in_decode else budget
        # Beside decodes, the step's prompt tokens are bounded by how many streams decode and wait:
        # a chunk is cut to fit, later prompts wait for the next step (off: no counting at all).
        per_decode = self.config.prefill_tokens_per_decode
        room = (
            prompt_room(sum(1 for s in queue if s.in_decode), self.policy.num_waiting(), per_decode)
            if per_decode
            else None
        )
        prompt_tokens = 0  # this step's prompt tokens, for prefill_group_tokens and the room
        while queue and budget > 0:
            seq = queue.pop(0)
            if not seq.in_decode:
                n = min(seq.num_uncomputed_tokens, budget, chunk_cap)
                if room is not None:
                    n = min(n, room - prompt_tokens)
                if n <= 0:
                    continue  # the room is spent: this prefill goes on next step
                if self._schedule_running(seq, n, [], queue, out, now):
                    budget -= n
                    prompt_tokens += n
                continue
            # Drafts ride on the decode token within the budget; the ones that do not fit wait.
            drafts, seq.spec_token_ids = seq.spec_token_ids, []
            n = min(seq.num_uncomputed_tokens + len(drafts), budget)
            if drafts and not self.kv.can_append(seq, n):
                n = min(seq.num_uncomputed_tokens, budget)  # speculation never causes a preemption
            if self._schedule_running(seq, n, drafts, queue, out, now):
                budget -= n

        # 2. New sequences (static batching: only once the previous batch has drained).
        if self.config.batching == "static":
            if not self.running and not out.preempted:
                self._admit_static_batch(out, budget, now)
        elif not out.preempted:  # memory short: don't admit what we would preempt next
            self._admit_waiting(out, budget, now, chunk_cap, prompt_tokens, room)
        out.block_copies = self.kv.take_block_copies()
        out.forks = {
            s.seq_id: list(self._followers[s.seq_id]) for s in out.sampling_seqs if s.seq_id in self._followers
        }
        return out

    def _schedule_running(
        self, seq: Sequence, n: int, drafts: list[int], queue: list[Sequence], out: SchedulerOutput, now: float
    ) -> bool:
        """Give ``seq`` ``n`` tokens of KV, preempting the policy's victims from ``queue`` while they
        do not fit. False when ``seq`` itself was preempted."""
        while not self.kv.can_append(seq, n):
            victim = self.policy.choose_victim(queue + [seq], now) if queue else seq
            self._preempt(victim, out)
            if victim is seq:
                return False
            queue.remove(victim)
        self.kv.allocate(seq, n)
        out.chunks.append(ScheduledChunk(seq, n, drafts[: n - seq.num_uncomputed_tokens]))
        return True

    def _admit_waiting(
        self,
        out: SchedulerOutput,
        budget: int,
        now: float,
        chunk_cap: int,
        prompt_tokens: int = 0,
        room: int | None = None,
    ) -> None:
        exclude: set[int] = set()
        running_adapters = Counter(s.adapter for s in self.running if s.adapter is not None)
        starving = self._starving_adapter()
        group = self.config.prefill_group_tokens
        # Beside decodes, the prompt room bounds the step's prompt tokens, cutting a prompt. Kept apart
        # from the budget: a preempted decode gives its token back to the budget, never to the room.
        room_left = None if room is None else room - prompt_tokens
        while budget > 0 and not (group and prompt_tokens >= group) and (room_left is None or room_left > 0):
            seq = self.policy.next_waiting(exclude, now)
            if seq is None:
                break
            full = self._slots_used() + self._slots_needed(seq) > self.config.max_num_seqs
            if full and self._within_caps(seq) and not self._admission_victims(seq, now):
                break
            if not self._adapter_fits(seq, running_adapters, starving) or not self._within_caps(seq):
                exclude.add(seq.seq_id)
                continue
            cached = self.kv.cached_prefix_len(seq)  # prefix caching: prefill only the rest
            cap = chunk_cap if room_left is None else min(chunk_cap, room_left)
            n = min(seq.num_uncomputed_tokens - cached, budget, cap)
            if full or not self.kv.can_admit(seq, n, cached):
                # The policy may let a waiting request push running ones out (a better class...).
                budget = self._preempt_for(seq, n, cached, out, budget, running_adapters, now)
                n = min(seq.num_uncomputed_tokens - cached, budget, cap)
                if self._slots_used() + self._slots_needed(seq) > self.config.max_num_seqs or not self.kv.can_admit(
                    seq, n, cached
                ):
                    break  # out of KV: later arrivals must not overtake (they would starve big prompts)
            self._start(seq, n, out, cached)
            budget -= n
            prompt_tokens += n
            if room_left is not None:
                room_left -= n
            if seq.adapter is not None:
                running_adapters[seq.adapter] += 1

    def _admit_static_batch(self, out: SchedulerOutput, budget: int, now: float) -> None:
        """Form a whole batch at once; its prefills are chunked by the budget over the next steps."""
        exclude: set[int] = set()
        running_adapters: Counter = Counter()
        room = self.kv.headroom()  # each member is promised its whole prompt's blocks up front
        while self._slots_used() < self.config.max_num_seqs:
            seq = self.policy.next_waiting(exclude, now)
            if seq is None or self._slots_used() + self._slots_needed(seq) > self.config.max_num_seqs:
                break
            if not self._adapter_fits(seq, running_adapters, None):
                exclude.add(seq.seq_id)
                continue
            if not room.take_tokens(seq.num_tokens):
                break
            cached = self.kv.cached_prefix_len(seq)
            n = min(seq.num_uncomputed_tokens - cached, budget)
            self._start(seq, n, out, cached)
            budget -= n
            if seq.adapter is not None:
                running_adapters[seq.adapter] += 1

    def _start(self, seq: Sequence, n: int, out: SchedulerOutput, num_cached: int = 0) -> None:
        self.policy.remove_waiting(seq)
        self._lora_blocked.pop(seq.seq_id, None)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self.admission_preemption.started(seq, self.step_count)
        self.kv.claim_cached_prefix(seq, num_cached)
        seq.num_computed_tokens = num_cached  # cached tokens are not charged as new prompt work
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = num_cached
        self.policy.on_admitted(seq, seq.num_uncomputed_tokens)
        if n > 0:
            self.kv.allocate(seq, n)
            out.chunks.append(ScheduledChunk(seq, n))

    def _within_caps(self, seq: Sequence) -> bool:
        """The engine's per-tenant admission caps; a tenant at one is skipped for the rest of the pass."""
        if self.caps.allows(seq, self.running):
            return True
        self.policy.skip_tenant(seq.tenant.tenant_id)
        return False

    def _slots_needed(self, seq: Sequence) -> int:
        """Batch slots admitting ``seq`` takes: itself and the followers that fork from it (n > 1)."""
        return 1 + len(self._followers.get(seq.seq_id, ()))

    def _slots_used(self) -> int:
        """Running sequences plus the followers already promised to running leaders."""
        if not self._followers:  # the common case (n == 1 everywhere): no set to build per candidate
            return len(self.running)
        running = {s.seq_id for s in self.running}
        return len(running) + sum(len(fs) for lid, fs in self._followers.items() if lid in running)

    def _adapter_fits(self, seq: Sequence, running_adapters: Counter, starving: str | None) -> bool:
        adapter = seq.adapter
        if adapter is None:
            return True
        if starving is not None and adapter != starving:
            # Admit nothing of other adapters (resident ones included, or they never leave) until a
            # slot frees for the starving one; base-model requests still flow.
            return False
        if adapter in running_adapters or len(running_adapters) < self.config.max_loras:
            return True
        self._lora_blocked.setdefault(seq.seq_id, self.step_count)
        return False

    def _starving_adapter(self) -> str | None:
        oldest = None
        for seq_id, since in self._lora_blocked.items():
            if self.step_count - since >= LORA_MAX_BLOCKED_STEPS and (oldest is None or since < oldest[1]):
                oldest = (seq_id, since)
        if oldest is None:
            return None
        for seq in self.policy.waiting():
            if seq.seq_id == oldest[0]:
                return seq.adapter
        self._lora_blocked.pop(oldest[0], None)
        return None

    def _admission_victims(self, seq: Sequence, now: float) -> list[Sequence]:
        """Running sequences the waiting ``seq`` may push out now: the policy's candidates (who gives
        way, in order) that the hysteresis guard lets go (``admission_preemption.py``)."""
        candidates = self.policy.preemption_candidates(seq, self.running, now)
        return self.admission_preemption.eligible(candidates, self.step_count) if candidates else []

    def _preempt_for(
        self,
        seq: Sequence,
        n: int,
        cached: int,
        out: SchedulerOutput,
        budget: int,
        running_adapters: Counter,
        now: float,
    ) -> int:
        """Preempt the policy's candidates, in order, until ``seq`` fits — none at all if even all
        of them would not make room. Returns the token budget (a victim scheduled this step gives
        its chunk back)."""
        victims = self._admission_victims(seq, now)
        short, chosen = self.kv.admission_shortfall(seq, n, cached), []
        slots = self.config.max_num_seqs - self._slots_used()
        need_slots = self._slots_needed(seq)
        for victim in victims:
            if short <= 0 and slots >= need_slots:
                break
            chosen.append(victim)
            short -= self.kv.blocks_held(victim)  # an estimate: shared blocks stay held
            slots += self._slots_needed(victim)
        if short > 0 or slots < need_slots:
            return budget
        self.admission_preemption.used(self.step_count, len(chosen))
        for victim in chosen:
            for chunk in [c for c in out.chunks if c.seq is victim]:
                out.chunks.remove(chunk)
                budget += chunk.num_tokens
            if victim.adapter is not None:
                running_adapters[victim.adapter] -= 1
                if running_adapters[victim.adapter] <= 0:
                    del running_adapters[victim.adapter]
            self._preempt(victim, out)
        return budget

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Free the victim's blocks; it will be recomputed (prompt + generated tokens) later."""
        self.running.remove(seq)
        self.admission_preemption.stopped(seq)
        self.kv.free(seq)
        seq.spec_token_ids = []
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.policy.add_waiting(seq, preempted=True)
        out.preempted.append(seq)

    # ------------------------------------------------------------------ after the model ran
    def update_from_output(self, out: SchedulerOutput, result: RunnerOutput) -> list[Sequence]:
        """Book a finished step: verified drafts join ``token_ids``, computed-token counts advance
        (full blocks go to the prefix cache: a hash never covers an unverified token), followers
        whose leader just prefilled fork, each sampled token is appended, the policy is charged
        for what was emitted, and sequences finish at EOS, a stop token id, a length limit or a
        complete grammar. KV of rejected drafts goes back to the pool.

        Returns the sequences that received tokens, in ``result`` order (the output processor's
        input)."""
        tokens_of = {seq.seq_id: tokens for seq, tokens in result.sampled}
        speculated: set[int] = set()
        for chunk in out.chunks:
            seq = chunk.seq
            if chunk.spec_token_ids:
                # The runner's tokens are the accepted drafts then the target's own token: only
                # the KV up to the last accepted draft is computed.
                accepted = len(tokens_of[seq.seq_id]) - 1
                seq.num_computed_tokens += chunk.num_tokens - (len(chunk.spec_token_ids) - accepted)
                speculated.add(seq.seq_id)  # its blocks are published once the drafts are text
            else:
                seq.num_computed_tokens += chunk.num_tokens
                self.kv.cache_computed_blocks(seq)  # full + computed: now reusable
            seq.prompt_logprobs.extend(result.prompt_logprobs.get(seq.seq_id, ()))
        for seq, _ in result.sampled:  # forks first: a leader that stops at once must not orphan them
            leader = seq.request.sequences[0]
            if seq is not leader and seq in self._followers.get(leader.seq_id, ()):
                self._fork(leader, seq)
        touched = []
        for seq, tokens in result.sampled:
            if seq.status is SequenceStatus.FINISHED:
                continue  # e.g. its request was aborted between planning and booking
            if seq.seq_id in speculated:
                seq.token_ids.extend(tokens[:-1])
                self.kv.cache_computed_blocks(seq)
                self.kv.truncate(seq, seq.num_computed_tokens)  # blocks that held only rejected drafts
            seq.token_ids.append(tokens[-1])
            lp = result.logprobs.get(seq.seq_id)
            if lp is not None:
                seq.logprobs.append(lp)
            self.policy.on_tokens_generated(seq, len(tokens))
            self._check_stop(seq, tokens[-1])
            if seq.seq_id in result.grammar_finished and not seq.is_finished:
                self.finish(seq, FinishReason.STOP)
            touched.append(seq)
        return touched

    def _check_stop(self, seq: Sequence, token: int) -> None:
        p = seq.request.params
        if not p.ignore_eos and token in self.eos_token_ids:
            self.finish(seq, FinishReason.STOP, None)
        elif token in p.stop_token_ids:
            self.finish(seq, FinishReason.STOP, token)
        elif seq.num_output_tokens >= p.max_tokens or (
            self.max_model_len is not None and seq.num_tokens >= self.max_model_len
        ):
            self.finish(seq, FinishReason.LENGTH)

    def stats(self) -> dict:
        return {
            "num_running": len(self.running),
            "num_waiting": self.policy.num_waiting(),
            "step": self.step_count,
            "admission_preemptions": self.admission_preemption.preemptions,
            **self.policy.stats(),
        }
