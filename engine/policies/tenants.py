"""Per-tenant bookkeeping every policy shares (who waits, who runs, what each tenant was served) and
the engine-level per-tenant admission caps (running-sequence cap, KV share cap, no batch hogging).

The book is fed by the policy hooks only, so it sees exactly what the scheduler decides. Caps are
engine rules, not ordering rules: the scheduler enforces them (``TenantCaps``) whatever the policy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..config import SchedulerConfig
from ..kv_cache import KVCacheManager
from ..sequence import Sequence, TenantInfo


@dataclass
class TenantLimits:
    max_num_seqs: int
    max_running_seqs_per_tenant: int | None = None  # default when the tenant sets none
    max_kv_share_per_tenant: float | None = None  # fraction of all KV blocks, enforced under contention

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> TenantLimits:
        return cls(config.max_num_seqs, config.max_running_seqs_per_tenant, config.max_kv_share_per_tenant)

    def running_cap(self, tenant: TenantInfo) -> int | None:
        return tenant.max_running_seqs if tenant.max_running_seqs is not None else self.max_running_seqs_per_tenant


class TenantBook:
    def __init__(self) -> None:
        self.tenants: dict[str, TenantInfo] = {}
        self.running: dict[str, dict[int, Sequence]] = {}
        self.num_waiting: Counter = Counter()
        self.prompt_tokens: Counter = Counter()  # prompt tokens admitted (charged once per sequence)
        self.output_tokens: Counter = Counter()
        self._admitted_once: set[int] = set()

    def _see(self, seq: Sequence) -> str:
        tid = seq.tenant.tenant_id
        self.tenants[tid] = seq.tenant
        return tid

    # ------------------------------------------------------------------ transitions
    def add_waiting(self, seq: Sequence, preempted: bool) -> None:
        tid = self._see(seq)
        self.num_waiting[tid] += 1
        if preempted:
            self.running.get(tid, {}).pop(seq.seq_id, None)

    def remove_waiting(self, seq: Sequence) -> None:
        tid = seq.tenant.tenant_id
        self.num_waiting[tid] -= 1
        if self.num_waiting[tid] <= 0:
            del self.num_waiting[tid]

    def admitted(self, seq: Sequence, num_new_prompt_tokens: int) -> int:
        """Record an admission; returns the prompt tokens to charge (0 for a recomputation)."""
        tid = self._see(seq)
        self.running.setdefault(tid, {})[seq.seq_id] = seq
        if seq.seq_id in self._admitted_once:
            return 0
        self._admitted_once.add(seq.seq_id)
        charged = max(0, min(num_new_prompt_tokens, seq.num_prompt_tokens))
        self.prompt_tokens[tid] += charged
        return charged

    def generated(self, seq: Sequence, n: int) -> None:
        self.output_tokens[self._see(seq)] += n

    def finished(self, seq: Sequence) -> None:
        tid = seq.tenant.tenant_id
        running = self.running.get(tid)
        if running is not None:
            running.pop(seq.seq_id, None)
            if not running:
                del self.running[tid]
        self._admitted_once.discard(seq.seq_id)

    # ------------------------------------------------------------------ queries
    def num_running(self, tid: str) -> int:
        return len(self.running.get(tid, ()))

    def others_waiting(self, tid: str, max_class: int | None = None) -> bool:
        """Another tenant waits (of class ``max_class`` or better, if given)."""
        return any(t != tid and (max_class is None or self.tenants[t].priority <= max_class) for t in self.num_waiting)

    def others_have_work(self, tid: str) -> bool:
        return self.others_waiting(tid) or any(t != tid for t in self.running)

    def running_adapters(self) -> Counter:
        return Counter(s.adapter for seqs in self.running.values() for s in seqs.values() if s.adapter is not None)

    def stats(self) -> dict:
        out = {}
        for tid in sorted(set(self.tenants) | set(self.running) | set(self.num_waiting)):
            info = self.tenants.get(tid)
            seqs = self.running.get(tid, {}).values()
            out[tid] = {
                "priority": info.priority if info else None,
                "weight": info.weight if info else None,
                "num_waiting": self.num_waiting.get(tid, 0),
                "num_running": len(seqs),
                "served_prompt_tokens": self.prompt_tokens.get(tid, 0),
                "served_output_tokens": self.output_tokens.get(tid, 0),
                "running_adapters": sorted({s.adapter for s in seqs if s.adapter is not None}),
            }
        return out


class TenantCaps:
    """May a tenant's waiting sequence start now? The scheduler asks before admitting; the policy's
    book (read only) says who waits and who runs. Under contention only: a tenant alone gets all."""

    def __init__(self, limits: TenantLimits, kv: KVCacheManager, book: TenantBook) -> None:
        self.limits = limits
        self.kv = kv
        self.book = book

    def allows(self, seq: Sequence, running: list[Sequence]) -> bool:
        tid = seq.tenant.tenant_id
        mine = sum(1 for s in running if s.tenant.tenant_id == tid)
        cap = self.limits.running_cap(seq.tenant)
        if cap is not None and mine >= cap:
            return False
        # No tenant takes the last batch slot while another (of its class or a better one) waits.
        if 1 < self.limits.max_num_seqs <= mine + 1 and self.book.others_waiting(tid, seq.tenant.priority):
            return False
        share = self.limits.max_kv_share_per_tenant
        if share is not None and self.book.others_have_work(tid):
            held = sum(len(self.kv.block_table(s)) for s in running if s.tenant.tenant_id == tid)
            if held + self.kv.blocks_for_tokens(seq.num_tokens) > share * self.kv.num_blocks:
                return False
        return True
