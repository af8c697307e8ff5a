"""Prefix-aware routing for the engine deployment (``[cluster] routing = "prefix"``).

A Serve ``RequestRouter`` that runs in each ingress (where the handle lives) and scores every
candidate replica by what it likely holds in its prefix cache, whether the request's adapter is
resident there, and its load, with a balance guard (ideas from NVIDIA Dynamo's KV-aware router,
llm-d's prefix-cache scorer and SGLang's cache-aware router; no code taken).

The compact per-replica summary: each replica keeps the routing keys of the prompts it served
recently, an LRU of at most ``MAX_KEYS`` 64-bit hashes, and reports it through Serve's
``record_routing_stats`` (every second). A key hashes (tenant salt, adapter, the first k·``SPAN``
prompt tokens) for k = 1..``MAX_SPANS``, chained like the engine's block hashes, so the number of
leading keys a replica knows is how many ``SPAN``-token blocks of this prompt it computed lately.
It approximates the engine's cache (recency, not the exact block pool) at 8 bytes a key and no
engine call on the step path.

Score = ``PREFIX_W`` · matched spans / spans + ``ADAPTER_W`` · (adapter resident) − ``LOAD_W`` · load
share. Balance guard: a replica more than ``GUARD`` requests busier than the least loaded one is
never preferred for its cache; the choice then goes by load alone.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

SPAN = 32  # tokens per routing block: prompts shorter than this have no prefix key
MAX_SPANS = 16  # keys per prompt: the first 512 tokens decide
MAX_KEYS = 8192  # per replica summary (64 KiB on the wire)
PREFIX_W, ADAPTER_W, LOAD_W = 2.0, 1.0, 1.0
GUARD = 8


def prefix_keys(prompt_ids: Sequence[int], adapter: str | None, salt: str | None) -> list[int]:
    """Chained 64-bit keys of the prompt's leading ``SPAN``-token blocks."""
    keys: list[int] = []
    parent = hashlib.blake2b(f"{salt or ''}\x00{adapter or ''}".encode(), digest_size=8).digest()
    for k in range(min(len(prompt_ids) // SPAN, MAX_SPANS)):
        block = ",".join(str(int(t)) for t in prompt_ids[k * SPAN : (k + 1) * SPAN]).encode()
        parent = hashlib.blake2b(parent + block, digest_size=8).digest()
        keys.append(int.from_bytes(parent, "little"))
    return keys


class PrefixSummary:
    """One replica's recently served prefix keys (an LRU); what it reports to the routers."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._keys: OrderedDict[int, None] = OrderedDict()
        self._max = max_keys

    def add(self, keys: list[int]) -> None:
        for key in keys:
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self._max:
            self._keys.popitem(last=False)

    def snapshot(self) -> list[int]:
        return list(self._keys)


def score(keys: list[int], held: frozenset[int], adapter_resident: bool, load: int, max_load: int) -> tuple[float, int]:
    """(score, matched spans) of one replica for one request."""
    matched = 0
    for key in keys:
        if key not in held:
            break
        matched += 1
    prefix = matched / len(keys) if keys else 0.0
    return PREFIX_W * prefix + ADAPTER_W * adapter_resident - LOAD_W * load / max(max_load, 1), matched


def rank(candidates: list[tuple[Any, float, int]], guard: int = GUARD) -> list[list[Any]]:
    """Ranks of replicas, best first, from (replica, score, load); the balance guard demotes any
    replica ``guard`` requests busier than the least loaded one below every other."""
    least = min(load for _r, _s, load in candidates)
    ok = [c for c in candidates if c[2] - least <= guard]
    busy = [c for c in candidates if c[2] - least > guard]
    ok.sort(key=lambda c: (-c[1], c[2]))
    busy.sort(key=lambda c: c[2])
    return [[c[0]] for c in ok + busy]


@functools.cache
def _router_class() -> type:
    """Built lazily: importing it needs Ray Serve (``--replicas 1`` never does)."""
    from ray.serve.request_router import FIFOMixin, MultiplexMixin, PendingRequest, RequestRouter, RunningReplica

    class PrefixAwareRouter(FIFOMixin, MultiplexMixin, RequestRouter):
        async def choose_replicas(
            self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
        ) -> list[list[RunningReplica]]:
            if not candidate_replicas:
                return []
            req = pending_request.args[0] if pending_request is not None and pending_request.args else None
            if not isinstance(req, dict) or "prompt_ids" not in req:
                return [candidate_replicas]  # not a generate call (health, stats): any replica
            adapter = req.get("adapter")
            keys = prefix_keys(req["prompt_ids"], adapter, req.get("cache_salt"))
            scored = []
            for r in candidate_replicas:
                stats = r.routing_stats or {}
                held = frozenset(stats.get("prefix_keys") or ())
                load = self.replica_queue_len_cache.get(r.replica_id)
                load = int(stats.get("ongoing", 0)) if load is None else int(load)
                resident = bool(adapter) and adapter in (r.multiplexed_model_ids or set())
                s, _matched = score(keys, held, resident, load, r.max_ongoing_requests)
                scored.append((r, s, load))
            return rank(scored)

    return PrefixAwareRouter


def __getattr__(name: str) -> Any:  # ``routing:PrefixAwareRouter`` as Serve imports it by path
    if name == "PrefixAwareRouter":
        return _router_class()
    raise AttributeError(name)
