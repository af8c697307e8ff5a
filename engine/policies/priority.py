"""Strict priority classes (lower runs first), first come first served inside a class, with aging
so a low class is never starved: a request waiting ``k * aging_s`` seconds is treated as ``k``
classes better (see ``classes.py``). Higher classes may preempt running lower-class sequences."""

from __future__ import annotations

from ..sequence import Sequence
from .classes import ClassQueuesPolicy, effective_class


class PriorityPolicy(ClassQueuesPolicy):
    name = "priority"

    def _pick(self, heads: list[tuple[str, Sequence]], now: float, top: int) -> Sequence:
        def key(h: Sequence) -> tuple[int, int, float, int]:
            cls = effective_class(h, now, self.aging_s, top)
            return (cls, 0 if cls < h.tenant.priority else 1, h.arrival_time, h.seq_id)  # aged ones first

        return min((h for _, h in heads), key=key)
