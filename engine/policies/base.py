"""The scheduling policy interface: the ORDER in which work runs, nothing else.

The scheduler owns the mechanics (token budget, KV blocks, LoRA slots, preemption) and the engine's
per-tenant admission caps (``tenants.TenantCaps``); a policy only answers "who next?", "who gives
way?" and keeps its own accounting through the ``on_*`` hooks. It never reads KV block tables.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from ..sequence import Sequence
from .tenants import TenantBook, TenantLimits


class SchedulingPolicy(ABC):
    name: str = "base"

    def __init__(self, limits: TenantLimits | None = None) -> None:
        self.book = TenantBook()
        self.limits = limits
        # Adapters loaded in device slots, if a LoRA manager tells us (running ones always count).
        self.resident_adapters_fn: Callable[[], Iterable[str]] | None = None
        self._blocked: set[str] = set()  # tenants at a cap during the current admission pass (skip_tenant)

    def _skipped(self, seq: Sequence, exclude: set[int]) -> bool:
        """For ``next_waiting``: excluded by the scheduler, or its tenant is at a limit this pass
        (so a flooding tenant at its cap costs one check per pass, not one per request)."""
        return seq.seq_id in exclude or seq.tenant.tenant_id in self._blocked

    def _new_pass(self, exclude: set[int]) -> None:
        if not exclude:  # the scheduler starts each admission pass with an empty exclude set
            self._blocked.clear()

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

    def skip_tenant(self, tenant_id: str) -> None:
        """The scheduler found ``tenant_id`` at an admission cap: ``next_waiting`` skips its
        sequences for the rest of this admission pass (one check per flooding tenant, not one per
        request)."""
        self._blocked.add(tenant_id)

    def preemption_candidates(self, seq: Sequence, running: list[Sequence], now: float) -> list[Sequence]:
        """Running sequences a WAITING ``seq`` may preempt to get in when the batch or KV is full,
        in the order they should go. Default: only the batch-hog rule — when ONE other tenant, of
        the same or a worse class, holds every running sequence, its newest one makes room (once: it
        may not retake the slot while others wait, see ``TenantCaps``). All of its sequences are
        named, newest first: the scheduler skips those that just started (its hysteresis) and takes
        only as many as the room needs."""
        if self.limits is None or self.limits.max_num_seqs < 2 or len(running) < self.limits.max_num_seqs:
            return []
        hog = running[0].tenant.tenant_id
        if (
            hog == seq.tenant.tenant_id
            or running[0].tenant.priority < seq.tenant.priority
            or any(s.tenant.tenant_id != hog for s in running)
        ):
            return []
        return sorted(running, key=lambda s: (s.arrival_time, s.seq_id), reverse=True)

    def resident_adapters(self) -> set[str]:
        resident = set(self.book.running_adapters())
        if self.resident_adapters_fn is not None:
            resident.update(self.resident_adapters_fn())
        return resident

    # ------------------------------------------------------------------ accounting hooks
    # Subclasses overriding a hook call super() so the tenant book stays right.
    def on_admitted(self, seq: Sequence, num_new_prompt_tokens: int) -> None:
        """``seq`` was scheduled for the first time since it last waited."""
        self.book.admitted(seq, num_new_prompt_tokens)

    def on_tokens_generated(self, seq: Sequence, num_tokens: int) -> None:
        """``seq`` produced ``num_tokens`` output tokens this step."""
        self.book.generated(seq, num_tokens)

    def on_finished(self, seq: Sequence) -> None:
        """``seq`` left the engine (finished or aborted)."""
        self.book.finished(seq)

    # ------------------------------------------------------------------ service elsewhere
    def local_service(self) -> dict[str, float]:
        """Fair-share service this engine gave each tenant (policies without counters: none)."""
        return {}

    def add_external_service(self, service: dict[str, float]) -> None:
        """Service other engines (replicas of one deployment) gave these tenants since the last
        call: a fair policy charges it like its own, so fairness holds across the replicas.
        Policies without counters have nothing to charge."""
        return None

    def charge_service(self, service: dict[str, float]) -> None:
        """Work this engine did for these tenants outside the batch (grammar compilation), already
        weight-normalised: a fair policy charges it like generated tokens. Others ignore it."""
        return None

    def stats(self) -> dict:
        """JSON-serialisable: policy name, per-tenant counts and served tokens, running adapters."""
        return {
            "policy": self.name,
            "tenants": self.book.stats(),
            "running_adapters": dict(self.book.running_adapters()),
        }
