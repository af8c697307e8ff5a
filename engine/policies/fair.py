"""Weighted fair sharing with the Virtual Token Counter (Sheng et al., OSDI'24), under priority classes.

One counter per tenant, in weight-normalised service units:
- admission charges ``w_p * prompt_tokens / weight`` once per sequence (a preempted sequence's
  recomputation is the engine's doing and is not charged again);
- every generated token charges ``w_q / weight``.
The next request comes from the backlogged (= has waiting requests) tenant with the smallest counter,
within the best class that waits; each tenant's own requests go in arrival order. A tenant that becomes
backlogged again is lifted to the smallest counter of the backlogged tenants of its class (or to the
counter of the last tenant that left the backlog when none is), so idling banks no credit.

Nested groups (the platform's projects, ``Request.group``): inside a tenant, the same again one
level down. A counter per (tenant, group) charged ``service / group weight``; the tenant's next
request comes from its best group priority, then its group with the smallest counter (oldest
first within a group); a group that becomes backlogged is lifted to the smallest counter of the
tenant's backlogged groups. The tenant's own counter is charged as before, so the tenant's share
among tenants is unchanged and its groups split it by their weights. Requests of no group form
one group of weight 1.

LoRA locality: when the fairest pick's adapter is not resident, a tenant whose counter is within
``locality_slack`` of it and whose next request needs no adapter swap may go first. Counters keep
charging as usual, so this can shift service between two backlogged tenants by at most the slack.
"""

from __future__ import annotations

from collections import Counter, deque

from ..sequence import Sequence
from .classes import ClassQueuesPolicy, aged_class, effective_class
from .tenants import TenantLimits


class FairPolicy(ClassQueuesPolicy):
    name = "fair"

    def __init__(
        self,
        limits: TenantLimits | None = None,
        aging_s: float = 0.0,
        prompt_weight: float = 1.0,
        output_weight: float = 2.0,
        locality_slack: float = 0.0,
        share_preemption: bool = True,
    ) -> None:
        super().__init__(limits, aging_s)
        self.prompt_weight = prompt_weight
        self.output_weight = output_weight
        self.locality_slack = locality_slack
        self.share_preemption = share_preemption
        self.counters: dict[str, float] = {}
        self.served: dict[str, float] = {}  # what this engine charged (lifts excluded), per tenant
        self._last_left: dict[int, float] = {}  # class -> counter of the last tenant leaving its backlog
        self.locality_picks = 0  # times locality overrode the fairest pick (stats)
        self.group_counters: dict[tuple[str, str | None], float] = {}  # (tenant, group key) -> counter
        # tenant -> its waiting sequences per group key (so a tenant of one group costs no scan)
        self._group_waiting: dict[str, Counter] = {}

    # ------------------------------------------------------------------ nested groups
    @staticmethod
    def _group_of(seq: Sequence) -> tuple[str, str | None]:
        group = seq.request.group
        return seq.tenant.tenant_id, group.key if group is not None else None

    @staticmethod
    def _group_priority(seq: Sequence) -> int:
        group = seq.request.group
        return group.priority if group is not None else 0

    def add_waiting(self, seq: Sequence, *, preempted: bool = False) -> None:
        tid, gid = self._group_of(seq)
        waiting = self._group_waiting.setdefault(tid, Counter())
        if not waiting[gid]:  # the group becomes backlogged: no credit banked while it idled
            floor = min((self.group_counters.get((tid, g), 0.0) for g in waiting), default=None)
            current = self.group_counters.get((tid, gid))
            if floor is not None:
                self.group_counters[tid, gid] = floor if current is None else max(current, floor)
            elif current is None:
                self.group_counters[tid, gid] = 0.0
        waiting[gid] += 1
        super().add_waiting(seq, preempted=preempted)

    def remove_waiting(self, seq: Sequence) -> None:
        super().remove_waiting(seq)
        tid, gid = self._group_of(seq)
        waiting = self._group_waiting[tid]
        waiting[gid] -= 1
        if waiting[gid] <= 0:
            del waiting[gid]
            if not waiting:
                del self._group_waiting[tid]

    def _head(self, queue: deque[Sequence], exclude: set[int]) -> Sequence | None:
        if not queue:
            return None
        groups = len(self._group_waiting.get(queue[0].tenant.tenant_id, ()))
        best: Sequence | None = None
        best_key: tuple[int, float] | None = None
        seen: set[tuple[str, str | None]] = set()
        for s in queue:  # arrival order: the first of each group is that group's head
            gid = self._group_of(s)
            if s.seq_id in exclude or gid in seen:
                continue
            seen.add(gid)
            key = (self._group_priority(s), self.group_counters.get(gid, 0.0))
            if best_key is None or key < best_key:
                best, best_key = s, key
            if len(seen) >= groups:  # every group of this tenant has offered its head
                break
        return best

    # ------------------------------------------------------------------ counters
    def _becomes_backlogged(self, seq: Sequence) -> None:
        tid, cls = seq.tenant.tenant_id, seq.tenant.priority
        backlogged = [
            self.counters[t] for t, q in self._queues.items() if q and t != tid and q[0].tenant.priority == cls
        ]
        floor = min(backlogged) if backlogged else self._last_left.get(cls)
        current = self.counters.get(tid)
        if floor is None:
            self.counters[tid] = current if current is not None else 0.0
        else:
            self.counters[tid] = floor if current is None else max(current, floor)

    def _leaves_backlog(self, seq: Sequence) -> None:
        self._last_left[seq.tenant.priority] = self.counters.get(seq.tenant.tenant_id, 0.0)

    def on_admitted(self, seq: Sequence, num_new_prompt_tokens: int) -> None:
        charged = self.book.admitted(seq, num_new_prompt_tokens)
        if charged:
            self._charge(seq, self.prompt_weight * charged)

    def on_tokens_generated(self, seq: Sequence, num_tokens: int) -> None:
        super().on_tokens_generated(seq, num_tokens)
        self._charge(seq, self.output_weight * num_tokens)

    def _charge(self, seq: Sequence, service: float) -> None:
        tid = seq.tenant.tenant_id
        self.counters[tid] = self.counters.get(tid, 0.0) + service / seq.tenant.weight
        gid = self._group_of(seq)
        group_weight = seq.request.group.weight if seq.request.group is not None else 1.0
        self.group_counters[gid] = self.group_counters.get(gid, 0.0) + service / group_weight
        self.served[tid] = self.served.get(tid, 0.0) + service / seq.tenant.weight

    def local_service(self) -> dict[str, float]:
        return dict(self.served)

    def add_external_service(self, service: dict[str, float]) -> None:
        # Global VTC (docs/scale-out.md): a tenant served on other replicas carries that service
        # here too, so flooding every replica cannot buy it more than its weighted share of any.
        # Already weight-normalised by the engine that served it (one weight per tenant everywhere).
        for tid, amount in service.items():
            if amount > 0:
                self.counters[tid] = self.counters.get(tid, 0.0) + amount

    def charge_service(self, service: dict[str, float]) -> None:
        # Counted as served here too, so replicas sharing service (global VTC) see it.
        for tid, amount in service.items():
            if amount > 0:
                self.counters[tid] = self.counters.get(tid, 0.0) + amount
                self.served[tid] = self.served.get(tid, 0.0) + amount

    # ------------------------------------------------------------------ choice
    def _pick(self, heads: list[tuple[str, Sequence]], now: float, top: int) -> Sequence:
        if not heads:
            raise ValueError("_pick needs at least one head")
        best_key: tuple[int, int, float, float, int] | None = None
        best = heads[0][1]
        fair_ones: list[tuple[int, float, Sequence]] = []
        for tid, head in heads:
            cls = effective_class(head, now, self.aging_s, top)
            if cls < head.tenant.priority:  # aged into a better class: oldest first
                key = (cls, 0, head.arrival_time, 0.0, head.seq_id)
            else:
                key = (cls, 1, self.counters.get(tid, 0.0), head.arrival_time, head.seq_id)
                fair_ones.append((cls, key[2], head))
            if best_key is None or key < best_key:
                best_key, best = key, head
        assert best_key is not None
        if self.locality_slack > 0 and best_key[1] == 1 and best.adapter is not None:
            resident = self.resident_adapters()
            if best.adapter not in resident:
                limit = best_key[2] + self.locality_slack
                local = [
                    (c, h)
                    for cls, c, h in fair_ones
                    if cls == best_key[0] and c <= limit and (h.adapter is None or h.adapter in resident)
                ]
                if local:
                    self.locality_picks += 1
                    return min(local, key=lambda ch: (ch[0], ch[1].arrival_time, ch[1].seq_id))[1]
        return best

    def preemption_candidates(self, seq: Sequence, running: list[Sequence], now: float) -> list[Sequence]:
        """Besides better classes (see ``classes.py``): a tenant below its weighted share of the
        batch's sequences, and not ahead on its counter, may take room from a same-class tenant
        that stays at or above its own share afterwards — the most over-served one (most running
        sequences per share), newest sequences first. The scheduler asks only when the batch is at
        a cap: ``max_num_seqs`` (the share is of the slots) or the KV cache (the share is of the
        sequences running now; the victims' blocks make the room). VTC alone would make a light
        tenant queue for room behind a flood; this cannot ping-pong (the loser is still at or above
        its share, so it may not take the room back), and the scheduler's hysteresis
        (``admission_preemption.py``) spares sequences that just started."""
        worse = super().preemption_candidates(seq, running, now)
        if any(s.tenant.priority > seq.tenant.priority for s in worse) or not self.share_preemption:
            return worse  # a better class first; the batch-hog rule only when share preemption is off
        shared = self._share_victims(seq, running)
        return shared or worse

    def _share_victims(self, seq: Sequence, running: list[Sequence]) -> list[Sequence]:
        if self.limits is None or not running:
            return []
        slots = min(len(running), self.limits.max_num_seqs)
        tid, cls = seq.tenant.tenant_id, seq.tenant.priority
        active = {
            t: info
            for t, info in self.book.tenants.items()
            if info.priority == cls and (t in self.book.running or t in self.book.num_waiting)
        }
        total_weight = sum(info.weight for info in active.values())
        share = lambda t: slots * active[t].weight / total_weight  # noqa: E731
        if tid not in active or self.book.num_running(tid) + 1 > share(tid):
            return []
        mine = self.counters.get(tid, 0.0)
        donors = [
            t
            for t in active
            if t != tid and self.book.num_running(t) - 1 >= share(t) and self.counters.get(t, 0.0) >= mine
        ]
        if not donors:
            return []
        donor = max(donors, key=lambda t: self.book.num_running(t) / share(t))
        surplus = int(self.book.num_running(donor) - share(donor))  # it may lose these, staying >= share
        theirs = sorted(
            (s for s in running if s.tenant.tenant_id == donor), key=lambda s: (s.arrival_time, s.seq_id), reverse=True
        )
        return theirs[:surplus]

    def _victim_key(self, seq: Sequence, now: float) -> tuple[float, ...]:
        # Worst (aged) class first; inside it, the tenant that has been served the most.
        return (
            aged_class(seq, now, self.aging_s),
            self.counters.get(seq.tenant.tenant_id, 0.0),
            seq.arrival_time,
            seq.seq_id,
        )

    def stats(self) -> dict:
        out = super().stats()
        for tid, entry in out["tenants"].items():
            entry["vtc_counter"] = round(self.counters.get(tid, 0.0), 3)
        out["locality_picks"] = self.locality_picks
        return out
