"""Hysteresis for preemptions made to ADMIT a waiting request — a better class, a tenant below its
fair share, the batch-hog rule — so that they never thrash.

The policy names the running sequences that may give way, in order (``preemption_candidates``);
this guard is the scheduler's side of the mechanism and narrows that list:

- a sequence that started running (or restarted after a preemption) fewer than ``min_run_steps``
  steps ago is not a candidate: between two preemptions every sequence makes progress, and a
  recomputation is never thrown away again at once;
- at most one waiting request preempts per step (it may take several victims when it needs their
  KV blocks), so a burst of arrivals cannot empty the batch in one step.

Preemptions that running sequences force when their own KV blocks run out (``choose_victim``) are
not limited here: those have no alternative.
"""

from __future__ import annotations

from .sequence import Sequence


class AdmissionPreemptionGuard:
    def __init__(self, min_run_steps: int) -> None:
        self.min_run_steps = min_run_steps
        self._started: dict[int, int] = {}  # seq_id -> the step it last started running
        self._last_step: int | None = None  # the last step a waiting request preempted in
        self.preemptions = 0  # admission preemptions made (stats)

    def started(self, seq: Sequence, step: int) -> None:
        self._started[seq.seq_id] = step

    def stopped(self, seq: Sequence) -> None:
        """``seq`` left the running set (finished, aborted or preempted)."""
        self._started.pop(seq.seq_id, None)

    def eligible(self, candidates: list[Sequence], step: int) -> list[Sequence]:
        """The policy's candidates that may be preempted at ``step``, in the policy's order."""
        if self._last_step == step:
            return []
        return [s for s in candidates if step - self._started.get(s.seq_id, step) >= self.min_run_steps]

    def used(self, step: int, num_victims: int) -> None:
        self._last_step = step
        self.preemptions += num_victims
