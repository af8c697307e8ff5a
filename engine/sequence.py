"""Requests and the sequences (one per sample) the scheduler moves between queues."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from .outputs import FinishReason
from .sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class AdapterRef:
    """Which adapter, and which content of it: a name re-registered with other weights is a new
    version with another hash, so nothing computed under the old one (KV, device slots) is reused."""

    name: str
    version: int
    sha256: str

    @property
    def cache_key(self) -> str:
        """The prefix-cache namespace: KV computed under one adapter content is never shared."""
        return f"{self.name}#{self.sha256}"


@dataclass
class TenantInfo:
    """What the engine knows of a tenant: fields on a request, nothing from the database."""

    tenant_id: str = "default"
    priority: int = 0  # lower runs first
    weight: float = 1.0  # fair share within a priority class
    max_running_seqs: int | None = None  # per-tenant cap inside the batch (None: engine default)


@dataclass
class GroupInfo:
    """The engine's record of a ``FairGroup`` (request.py) of one tenant; requests share it."""

    key: str
    priority: int = 0
    weight: float = 1.0


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    adapter: AdapterRef | None = None
    tenant: TenantInfo = field(default_factory=TenantInfo)
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    group: GroupInfo | None = None  # its place inside the tenant's fair share (None: the tenant's own)
    sequences: list[Sequence] = field(default_factory=list)
    first_token_time: float | None = None
    finish_time: float | None = None
    error: str | None = None

    @property
    def tenant_id(self) -> str:
        return self.tenant.tenant_id

    @property
    def adapter_name(self) -> str | None:
        return self.adapter.name if self.adapter is not None else None

    @property
    def finished(self) -> bool:
        return all(s.status is SequenceStatus.FINISHED for s in self.sequences)


_seq_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    request: Request
    index: int  # sample index within the request (n > 1)
    token_ids: list[int]  # prompt + verified output tokens; never a speculative draft
    num_prompt_tokens: int
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (stats)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    num_preemptions: int = 0
    generator: torch.Generator | None = None
    text: str = ""  # detokenized output so far (kept by the output processor)
    logprobs: list = field(default_factory=list)  # one sampler.TokenLogprobs per output token, if asked
    # prompt_logprobs: entry p is prompt token p+1's (the first token has none); the leader only.
    prompt_logprobs: list = field(default_factory=list)
    # Speculative decoding: tokens proposed for the next step, not yet verified. They live here,
    # never in token_ids, so prefix hashing, stop checks and penalties only ever see real tokens.
    spec_token_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def in_decode(self) -> bool:
        return self.num_uncomputed_tokens == 1 and self.num_computed_tokens > 0

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.request.params.max_tokens

    # Conveniences used by scheduling policies.
    @property
    def tenant(self) -> TenantInfo:
        return self.request.tenant

    @property
    def arrival_time(self) -> float:
        return self.request.arrival_time

    @property
    def adapter(self) -> str | None:
        """The adapter's name: the key of its device slot and of the per-step adapter limit."""
        return self.request.adapter_name
