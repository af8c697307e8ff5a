"""Shortest expected job first, for the lowest mean latency. Expected length = prompt + ``max_tokens``.

Aging keeps long jobs moving: a job ranks as if it had arrived ``aging_s * length / longest``
seconds late (``longest``: the longest expected job seen so far). The shortest jobs rank by arrival,
the longest are pushed back by at most ``aging_s``, so no job is ever overtaken by one that arrived
more than ``aging_s`` after it. Tenants' classes and weights are ignored (the engine's per-tenant
limits still apply).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..sequence import Sequence
from .base import SchedulingPolicy
from .tenants import TenantLimits


def expected_length(seq: Sequence) -> int:
    return seq.num_prompt_tokens + seq.request.params.max_tokens


class SJFPolicy(SchedulingPolicy):
    name = "sjf"

    def __init__(self, limits: TenantLimits | None = None, aging_s: float = 30.0) -> None:
        super().__init__(limits)
        self.aging_s = aging_s
        self._waiting: dict[int, Sequence] = {}
        self._longest = 1

    def add_waiting(self, seq: Sequence, *, preempted: bool = False) -> None:
        self.book.add_waiting(seq, preempted)
        self._waiting[seq.seq_id] = seq
        self._longest = max(self._longest, expected_length(seq))

    def remove_waiting(self, seq: Sequence) -> None:
        del self._waiting[seq.seq_id]
        self.book.remove_waiting(seq)

    def rank(self, seq: Sequence) -> float:
        return seq.arrival_time + self.aging_s * expected_length(seq) / self._longest

    def next_waiting(self, exclude: set[int], now: float) -> Sequence | None:
        self._new_pass(exclude)
        best, best_key = None, None
        for seq in self._waiting.values():
            if self._skipped(seq, exclude):
                continue
            key = (self.rank(seq), seq.seq_id)
            if best_key is None or key < best_key:
                best, best_key = seq, key
        return best

    def num_waiting(self) -> int:
        return len(self._waiting)

    def waiting(self) -> Iterable[Sequence]:
        return list(self._waiting.values())

    def order_running(self, running: list[Sequence], now: float) -> list[Sequence]:
        return sorted(running, key=lambda s: (self.rank(s), s.seq_id))
