"""First come, first served: one global queue in arrival order."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ..sequence import Sequence
from .base import SchedulingPolicy
from .tenants import TenantLimits


class FCFSPolicy(SchedulingPolicy):
    name = "fcfs"

    def __init__(self, limits: TenantLimits | None = None) -> None:
        super().__init__(limits)
        self._queue: deque[Sequence] = deque()

    def add_waiting(self, seq: Sequence, *, preempted: bool = False) -> None:
        self.book.add_waiting(seq, preempted)
        if preempted:
            # A preempted sequence arrived before everything still waiting: it goes back in front,
            # in arrival order among other preempted ones.
            i = 0
            while i < len(self._queue) and self._queue[i].arrival_time <= seq.arrival_time:
                i += 1
            self._queue.insert(i, seq)
        else:
            self._queue.append(seq)

    def remove_waiting(self, seq: Sequence) -> None:
        self._queue.remove(seq)
        self.book.remove_waiting(seq)

    def next_waiting(self, exclude: set[int], now: float) -> Sequence | None:
        self._new_pass(exclude)
        for seq in self._queue:
            if not self._skipped(seq, exclude):
                return seq
        return None

    def num_waiting(self) -> int:
        return len(self._queue)

    def waiting(self) -> Iterable[Sequence]:
        return list(self._queue)
