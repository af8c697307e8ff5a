"""EngineRequest: the one description of a request, built by the caller (``LLM``, the server's
engine client, a benchmark) and handed to ``LLMEngine.add_request`` / ``AsyncEngine.submit``.

``resume_token_ids`` continues a request another engine already began (a replica that died mid-stream,
``platform/cluster/remote_stream.py``): the output tokens generated so far. They follow the prompt
but count as output (``max_tokens``, penalties, ``min_tokens``, stop strings, the grammar), a seeded
sample's generator is advanced past them, and the outputs are those of the uninterrupted request:
the first one carries them again (their logprobs as ``None``), so a caller drops what it already has.

A request carries its tenant's id only: priority, weight and caps are the engine's own record of the
tenant (``set_tenant``), written by the admin side and at start, so a request can never revert them.
``fair_group`` nests fairness one level down (the platform's projects): the tenant's share is split
among its groups by weight; being many and short-lived, groups travel with their requests.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from .outputs import OutputKind
from .sampling_params import SamplingParams


@dataclass(frozen=True)
class FairGroup:
    """A subdivision of a tenant's fair share (the platform's projects): an opaque ``key`` unique
    within the tenant, a ``priority`` (lower first, within the tenant only) and a ``weight`` that
    splits the tenant's share among its groups. The engine keeps one ``GroupInfo`` per (tenant,
    key); the latest request's values update it (and so reach the group's queued requests)."""

    key: str
    priority: int = 0
    weight: float = 1.0


@dataclass
class EngineRequest:
    prompt: str | list[int]  # text (tokenized by the engine) or token ids
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    adapter: str | None = None  # a registered adapter's name; None = the base model
    tenant_id: str = "default"
    fair_group: FairGroup | None = None  # a subdivision of the tenant's fair share (nested fairness)
    cache_salt: str | None = None  # prefix-cache namespace (the platform salts by tenant)
    arrival_time: float | None = None  # monotonic seconds; default: when the engine takes it
    output_kind: OutputKind = OutputKind.CUMULATIVE
    # The compiled grammar of params.structured_output, attached by LLMEngine.validate on the
    # caller's thread so that the engine thread, which validates again, never compiles.
    grammar: Any = field(default=None, repr=False, compare=False)
    resume_token_ids: list[int] = field(default_factory=list)  # output already generated (n = 1 only)
