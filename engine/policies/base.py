"""The scheduling policy interface: the ORDER in which work runs, nothing else.

The scheduler owns the mechanics (token budget, KV blocks, LoRA slots, preemption); a policy only
answers "who next?", "who gives way?" and keeps its own accounting through the ``on_*`` hooks.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable

from ..sequence import Sequence


class SchedulingPolicy(ABC):
    name: str = "base"

    # ------------------------------------------------------------------ waiting queue
    @abstractmethod
    def add_waiting(self, seq: Sequence, *, preempted: bool = False) -> None:
        """A new (or preempted, to be recomputed) sequence waits to run."""

    @abstractmethod
    def remove_waiting(self, seq: Sequence) -> None:
        """``seq`` leaves the waiting queue (admitted or aborted)."""

    @abstractmethod
    def next_waiting(self, exclude: set[int], now: float) -> Sequence | None:
        """The waiting sequence to admit next, skipping seq_ids in ``exclude`` (those the scheduler
        could not place this step). Called repeatedly within a step, with accounting hooks in
        between, so the answer may change as counters move."""

    @abstractmethod
    def num_waiting(self) -> int: ...

    @abstractmethod
    def waiting(self) -> Iterable[Sequence]:
        """Every waiting sequence, any order (for stats and aborts)."""

    # ------------------------------------------------------------------ running set
    def order_running(self, running: list[Sequence], now: float) -> list[Sequence]:
        """Most important first: who gets token budget first, and (reversed) who is preempted first."""
        return sorted(running, key=lambda s: (s.arrival_time, s.seq_id))

    def choose_victim(self, candidates: list[Sequence], now: float) -> Sequence:
        """Which running sequence gives its KV blocks back when memory runs out."""
        return self.order_running(candidates, now)[-1]

    def may_admit(self, seq: Sequence, running: list[Sequence]) -> bool:
        """Extra per-policy admission rules (per-tenant caps...). Default: none."""
        return True

    def preemption_candidates(self, seq: Sequence, running: list[Sequence], now: float) -> list[Sequence]:
        """Running sequences a WAITING ``seq`` may preempt to get in when the batch or KV is full.
        Default: none (only running sequences preempt, and only to make room for themselves)."""
        return []

    # ------------------------------------------------------------------ accounting hooks
    def on_admitted(self, seq: Sequence, num_new_prompt_tokens: int) -> None:
        """``seq`` was scheduled for the first time since it last waited."""

    def on_tokens_generated(self, seq: Sequence, num_tokens: int) -> None:
        """``seq`` produced ``num_tokens`` output tokens this step."""

    def on_finished(self, seq: Sequence) -> None:
        """``seq`` left the engine (finished or aborted)."""

    def stats(self) -> dict:
        return {"policy": self.name}
