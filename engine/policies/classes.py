"""Per-tenant FIFO queues under priority classes — the common ground of ``priority`` and ``fair``.

A tenant's class is read from its ``TenantInfo`` at every decision, so an admin change applies to
queued requests at once. Aging: a waiting request gains one class per ``aging_s`` seconds, but never
climbs above the best class that is waiting now (within the top class aging changes nothing, so it
cannot override fair sharing there). Aged requests go first in their class, oldest first.

Preemption: a waiting request may push out running sequences of a strictly worse BASE class (aging
grants order, never preemption rights, so two classes cannot take turns preempting each other). A
running sequence that has aged up to the preemptor's class is protected, or a flood of the better
class would push every aged request straight back out and starve it after all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ..sequence import Sequence
from .base import SchedulingPolicy
from .tenants import TenantLimits


def aged_class(seq: Sequence, now: float, aging_s: float) -> int:
    cls = seq.tenant.priority
    if aging_s > 0:
        cls -= int(max(0.0, now - seq.arrival_time) // aging_s)
    return cls


def effective_class(seq: Sequence, now: float, aging_s: float, top: int) -> int:
    return max(aged_class(seq, now, aging_s), top)


class ClassQueuesPolicy(SchedulingPolicy):
    def __init__(self, limits: TenantLimits | None = None, aging_s: float = 0.0) -> None:
        super().__init__(limits)
        self.aging_s = aging_s
        self._queues: dict[str, deque[Sequence]] = {}
        self._num_waiting = 0

    # ------------------------------------------------------------------ waiting queue
    def add_waiting(self, seq: Sequence, *, preempted: bool = False) -> None:
        tid = seq.tenant.tenant_id
        queue = self._queues.get(tid)
        if not queue:
            self._becomes_backlogged(seq)
            queue = self._queues[tid] = deque()
        self.book.add_waiting(seq, preempted)
        self._num_waiting += 1
        if preempted:
            # Back in arrival order: a preempted sequence arrived before its tenant's newer ones.
            i = 0
            while i < len(queue) and queue[i].arrival_time <= seq.arrival_time:
                i += 1
            queue.insert(i, seq)
        else:
            queue.append(seq)

    def remove_waiting(self, seq: Sequence) -> None:
        tid = seq.tenant.tenant_id
        queue = self._queues[tid]
        queue.remove(seq)
        self.book.remove_waiting(seq)
        self._num_waiting -= 1
        if not queue:
            del self._queues[tid]
            self._leaves_backlog(seq)

    def num_waiting(self) -> int:
        return self._num_waiting

    def waiting(self) -> Iterable[Sequence]:
        return [s for q in self._queues.values() for s in q]

    def next_waiting(self, exclude: set[int], now: float) -> Sequence | None:
        self._new_pass(exclude)
        heads: list[tuple[str, Sequence]] = []
        for tid, queue in self._queues.items():
            if tid in self._blocked:
                continue
            head = self._head(queue, exclude)
            if head is not None:
                heads.append((tid, head))
        if not heads:
            return None
        top = min(h.tenant.priority for _, h in heads)
        return self._pick(heads, now, top)

    # ------------------------------------------------------------------ running set
    def order_running(self, running: list[Sequence], now: float) -> list[Sequence]:
        return sorted(running, key=lambda s: (s.tenant.priority, s.arrival_time, s.seq_id))

    def choose_victim(self, candidates: list[Sequence], now: float) -> Sequence:
        return max(candidates, key=lambda s: self._victim_key(s, now))

    def preemption_candidates(self, seq: Sequence, running: list[Sequence], now: float) -> list[Sequence]:
        cls = seq.tenant.priority
        worse = [s for s in running if s.tenant.priority > cls and aged_class(s, now, self.aging_s) > cls]
        if worse:
            return sorted(worse, key=lambda s: self._victim_key(s, now), reverse=True)
        return super().preemption_candidates(seq, running, now)

    # ------------------------------------------------------------------ subclass hooks
    def _head(self, queue: deque[Sequence], exclude: set[int]) -> Sequence | None:
        """The tenant's request to offer next: its oldest one (a fair policy nests groups here)."""
        return next((s for s in queue if s.seq_id not in exclude), None)

    def _victim_key(self, seq: Sequence, now: float) -> tuple[float, ...]:
        """Larger = preempted first: the worst (aged) class, then the newest."""
        return (aged_class(seq, now, self.aging_s), seq.arrival_time, seq.seq_id)

    def _pick(self, heads: list[tuple[str, Sequence]], now: float, top: int) -> Sequence:
        raise NotImplementedError

    def _becomes_backlogged(self, seq: Sequence) -> None:
        pass

    def _leaves_backlog(self, seq: Sequence) -> None:
        pass
