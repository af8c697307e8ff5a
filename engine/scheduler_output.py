"""The plan of one engine step (``Scheduler.schedule()`` -> ``SchedulerOutput``): plain data the
runner turns into tensors, and the scheduler books again in ``update_from_output``. Its own module,
as vLLM v1's ``sched/output.py``: the runner, the draft proposer and simulations read it without
importing the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sequence import Sequence


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_tokens: int  # tokens whose KV is computed this step (1 for a decode, 1 + drafts when speculating)
    # Speculative decoding: the drafts this step verifies (the last len() of num_tokens positions).
    spec_token_ids: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """The chunk reaches the sequence's last token, so the step produces its next token."""
        return self.seq.num_computed_tokens + self.num_tokens - len(self.spec_token_ids) == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # Copy-on-write (src, dst) KV block copies the runner applies before this step's forward.
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # n > 1: leader seq_id -> followers that draw their first token from the leader's logits row
    # this step (the leader's prompt is computed by this step's chunk).
    forks: dict[int, list[Sequence]] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def adapters(self) -> set[str]:
        return {c.seq.adapter for c in self.chunks if c.seq.adapter is not None}

    @property
    def sampling_seqs(self) -> list[Sequence]:
        """Sequences whose chunk produces a token this step, in chunk order."""
        return [c.seq for c in self.chunks if c.samples]

    @property
    def sampling_targets(self) -> list[Sequence]:
        """Every sequence that receives a token this step: each sampling sequence followed by the
        followers forking from it (a model-free driver books one token for each of these)."""
        return [t for s in self.sampling_seqs for t in (s, *self.forks.get(s.seq_id, ()))]

    def __bool__(self) -> bool:
        return bool(self.chunks)
