"""The one seam between the platform and an engine: ``EngineClient``.

Two implementations, by composition: ``LocalEngineClient`` (an ``AsyncEngine`` in this process) and
``RemoteEngineClient`` (the Ray Serve engine deployment, ``platform/cluster``). Admission, billing,
the admin API and the tokenizer routes see only this Protocol, so every feature reaches both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from loraplex.platform.adapters.sources.uri import AdapterReference
from loraplex.platform.errors import Unprocessable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loraplex.engine import FairGroup, RequestOutput, SamplingParams

# Live engine state as the admin API and /metrics read it (JSON values: numbers, names, nested maps).
EngineStats = dict[str, object]


@dataclass(frozen=True)
class AdapterFacts:
    rank: int
    alpha: float
    target_modules: list[str]
    use_rslora: bool
    base_model: str


class AdapterInvalid(Unprocessable):
    code = "invalid_adapter"


@runtime_checkable
class EngineStream(Protocol):
    """One request's DELTA outputs. ``open()`` returns once an engine accepted the request (its
    4xx refusal surfaces there, before any byte of the response); ``replica`` then names it."""

    replica: str

    async def open(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[RequestOutput]: ...

    async def __anext__(self) -> RequestOutput: ...

    async def aclose(self) -> None: ...


class EngineClient(Protocol):
    @property
    def enabled(self) -> bool: ...

    @property
    def alive(self) -> bool: ...

    @property
    def replica_name(self) -> str: ...

    @property
    def model_dir(self) -> Path | None: ...

    @property
    def model_name(self) -> str: ...

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...

    @property
    def max_model_len(self) -> int: ...

    def max_prompt_chars(self) -> int | None: ...

    def resolved_config(self) -> dict[str, object]: ...

    def shutdown(self) -> None: ...

    # -- requests ---------------------------------------------------------------------------
    def check_sampling(self, params: SamplingParams, *, tenant_id: str | None) -> None:
        """Refuse (4xx) what the engine would refuse of ``params``: its request limits, and a
        structured-output spec that does not compile (compiled here, call from a worker thread),
        so a bad schema is a 400 before any quota is reserved."""
        ...

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        adapter: str | None,
        tenant_id: str,
        cache_salt: str | None,
        fair_group: FairGroup | None = None,  # the key's project inside the tenant's fair share
    ) -> EngineStream: ...

    def abort(self, request_id: str) -> None: ...

    # -- control ----------------------------------------------------------------------------
    def set_tenant(self, tenant_id: str, priority: int, weight: float, max_running_seqs: int | None) -> None: ...

    def validate_adapter(self, path: Path) -> AdapterFacts: ...

    def add_adapter(self, key: str, path: Path) -> None:
        """Register the adapter in the folder ``path`` (a file this process can read) as ``key``."""
        ...

    def resolves_references(self) -> bool:
        """Does the engine fetch by-reference adapters itself? True for a scale-out (each engine
        replica fetches into its own disk cache, on its own node): the caller hands the reference
        on with ``add_adapter_reference`` and downloads nothing. False for one process: the caller
        fetches the folder (``adapters/sources/serving.py``: disk cache, pins, new versions) and
        registers it with ``add_adapter``."""
        ...

    def add_adapter_reference(self, key: str, ref: AdapterReference) -> None:
        """Register ``ref`` as ``key`` for the engine to fetch itself (only where
        ``resolves_references()``; elsewhere a 503)."""
        ...

    def remove_adapter(self, key: str) -> None: ...

    def registered_adapters(self) -> list[str]: ...

    def stats(self) -> EngineStats: ...
