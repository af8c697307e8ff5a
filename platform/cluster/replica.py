"""One engine replica of the Ray Serve deployment: owns one ``AsyncEngine`` (through the ordinary
``LocalEngineClient``) and streams a request's DELTA outputs back to the ingress as plain dicts.

The adapter is Serve's multiplexed model id: ``get_adapter`` is the ``serve.multiplexed`` loader,
so Serve's router sends an adapter's requests to the replicas that report it loaded and a
base-model request (no id) to the least loaded one. The engine keeps its own LRU of device slots
(``max_loras``) and CPU copies; loading reads the shared adapter store on first use. Adapters
registered by reference are fetched by this replica itself, into a disk cache of its own
(``replica_cache.py``): no filesystem is shared with the ingress or another replica.

Tenant and adapter changes come from the control-plane actor: pulled at start, on a timer, and
before a request that was admitted under a newer version than this replica has applied.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from loraplex.platform.adapters.sources.resolver import AdapterResolver, cache_root
from loraplex.platform.adapters.sources.uri import AdapterReference
from loraplex.platform.cluster.control import ACTOR_NAME, NAMESPACE
from loraplex.platform.cluster.messages import (
    Accepted,
    AdapterSource,
    EngineState,
    GenerateRequest,
    HeartbeatAnswer,
    Output,
    ReplicaReport,
    StreamChunk,
    StreamError,
)
from loraplex.platform.cluster.replica_cache import ReplicaCacheDir
from loraplex.platform.cluster.routing import PrefixSummary, prefix_keys
from loraplex.platform.engine_client import LocalEngineClient
from loraplex.platform.errors import PlatformError
from loraplex.platform.settings import Settings

log = logging.getLogger("loraplex.platform.cluster")


class EngineReplica:
    def __init__(self, settings: Settings) -> None:
        import ray
        from ray import serve

        self.settings = settings  # deploy.cluster_settings(): as the driver resolved them
        ctx = serve.get_replica_context()
        self.name = f"engine-{ctx.replica_id.unique_id}"
        self.control: Any = ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)  # ControlPlane's methods, .remote
        # Adapters by reference (s3://, hf://, file://): fetched by this replica into its own disk
        # cache, on its own node (replica_data_dir), never through the ingress's.
        self.cache_dir = ReplicaCacheDir.claim(replica_cache_parent(self.settings), self.name)
        self.resolver = AdapterResolver.from_settings(self.settings, cache_dir=self.cache_dir.path)
        self.engine = LocalEngineClient.start(self.settings, references=self.resolver)
        self._applied = -1
        self._adapters: dict[str, AdapterSource] = {}
        self._sync_lock = threading.Lock()
        self._prefixes = PrefixSummary()  # prompts served lately: what prefix-aware routers read
        self._ongoing = 0
        self._served: dict[str, float] = {}  # this engine's fair-share service per tenant
        self._others_seen: dict[str, float] = {}  # the other replicas' service, as last charged
        self._stop = threading.Event()
        self.sync()  # before the first request: every tenant and adapter of the control plane
        # serve.multiplexed with this deployment's own bound (from settings), hence built here.
        per_replica = self.settings.cluster.max_adapters_per_replica or int(self.settings.engine.max_loras)

        async def load_adapter(adapter_id: str) -> str:
            return await self._multiplexed_adapter(adapter_id)

        self.get_adapter = serve.multiplexed(max_num_models_per_replica=per_replica)(load_adapter)
        self._thread = threading.Thread(target=self._loop, name="loraplex-replica-sync", daemon=True)
        self._thread.start()
        log.info("engine replica %s up (pid %d)", self.name, os.getpid())

    # -- control-plane state -----------------------------------------------------------------
    def sync(self) -> None:
        """Pull and apply the control plane's state (blocking: the sync thread or a worker)."""
        import ray

        state: EngineState | None = ray.get(self.control.state.remote(self._applied), timeout=30)
        self._apply(state)

    async def sync_async(self) -> None:
        """The same from the request path: the actor call is awaited, the engine calls (which
        wait for a step boundary) run in a worker thread."""
        state = await self.control.state.remote(self._applied)
        if state is not None:
            await asyncio.to_thread(self._apply, state)

    def _apply(self, state: EngineState | None) -> None:
        if state is None:
            return
        with self._sync_lock:
            if state.version == self._applied:
                return
            for tenant_id, t in state.tenants.items():
                self.engine.set_tenant(tenant_id, t.priority, t.weight, t.max_running_seqs)
            wanted = state.adapters
            for key in [k for k in self._adapters if k not in wanted or wanted[k] != self._adapters[k]]:
                self.engine.remove_adapter(key)
                del self._adapters[key]
            for key, source in wanted.items():
                if key not in self._adapters:
                    self._load_adapter(key, source)
            self._applied = state.version

    def _load_adapter(self, key: str, source: AdapterSource) -> None:
        """The one place a replica gets an adapter's weights into its engine: a folder of the
        shared adapter store, or a reference this engine fetches itself (its own disk cache)."""
        try:
            if isinstance(source, AdapterReference):
                self.engine.add_adapter_reference(key, source)
            else:
                self.engine.add_adapter(key, Path(source.path))
            self._adapters[key] = source
        except PlatformError as exc:  # reported to the request that asks for it
            log.error("replica %s cannot register adapter %s: %s", self.name, key, exc.message)

    def _loop(self) -> None:
        import ray

        interval = self.settings.cluster.sync_interval_s
        while not self._stop.wait(interval):
            try:
                self.sync()
                answer: HeartbeatAnswer = ray.get(self.control.report.remote(self.report(), self._served), timeout=30)
                self._exchange_service(answer.others)
            except Exception as exc:  # noqa: BLE001 - the control plane restarting: try again next tick
                log.warning("replica %s: sync failed: %s", self.name, exc)

    def _exchange_service(self, others: dict[str, float]) -> None:
        """Global VTC: charge this engine's fair counters with the growth of what the other
        replicas served each tenant since the last tick, and keep our own total for the next
        report. A total that went down (a restarted control plane forgot it) is not charged back."""
        if not self.settings.cluster.global_fairness:
            return
        delta = {tid: total - self._others_seen.get(tid, 0.0) for tid, total in others.items()}
        self._others_seen = dict(others)
        self._served = self.engine.exchange_fair_service({t: d for t, d in delta.items() if d > 0})

    def report(self) -> ReplicaReport:
        stats = self.engine.stats()
        stats.pop("enabled", None)
        return ReplicaReport(self.name, os.getpid(), self._applied, stats, adapter_sources=dict(self.resolver.counters))

    # -- requests ----------------------------------------------------------------------------
    async def _multiplexed_adapter(self, adapter_id: str) -> str:
        # The engine loads the weights itself on first use (LRU within max_loras); what Serve
        # caches here is only the fact "this replica serves adapter X", which steers its router.
        if adapter_id not in self._adapters:
            await self.sync_async()
        return adapter_id

    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamChunk]:
        """Yields ``Accepted`` once the engine took the request, then an ``Output`` per DELTA
        output; a platform error is a ``StreamError``, which the ingress raises again as the same
        4xx/503."""
        from ray import serve

        routed_by = serve.get_multiplexed_model_id()
        adapter = routed_by or req.adapter or None
        if req.version > self._applied:
            await self.sync_async()
        if routed_by:
            await self.get_adapter(routed_by)
        elif adapter:
            await self._multiplexed_adapter(adapter)
        rid = req.request_id
        finished = False
        self._ongoing += 1
        self._prefixes.add(prefix_keys(req.prompt_ids, req.adapter, req.cache_salt))
        try:
            params = req.params
            if params.structured_output is not None:  # compiled off this replica's event loop (cached)
                await asyncio.to_thread(self.engine.compile_structured, params.structured_output)
            stream = self.engine.submit(
                req.prompt_ids,
                params,
                request_id=rid,
                adapter=adapter,
                tenant_id=req.tenant_id,
                cache_salt=req.cache_salt,
                resume_token_ids=req.resume_token_ids,  # continuing a dead replica's request
                fair_group=req.fair_group,
            )
            yield Accepted(self.name)
            async for out in stream:  # the engine's DELTA RequestOutput itself (all choices, logprobs)
                finished = bool(out.finished)
                yield Output(out)
        except PlatformError as exc:
            finished = True
            yield StreamError.of(exc)
        finally:
            self._ongoing -= 1
            if not finished:  # the ingress cancelled (client gone, abort, retry elsewhere)
                self.engine.abort(rid)

    def record_routing_stats(self) -> dict[str, object]:
        """Polled by Serve for the prefix-aware routers (``cluster/routing.py``)."""
        return {"prefix_keys": self._prefixes.snapshot(), "ongoing": self._ongoing}

    def check_health(self) -> None:
        if not self.engine.alive:
            raise RuntimeError(f"engine loop of {self.name} is not running")

    def __del__(self) -> None:
        # Also after an __init__ that failed part way (an engine that refused its configuration):
        # release what was built, skip what was not.
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        if hasattr(self, "engine"):
            try:
                self.control.forget.remote(self.name)
            except Exception:  # noqa: BLE001 - shutting down anyway
                pass
            self.engine.shutdown()
        if hasattr(self, "resolver"):
            self.resolver.close()
        if hasattr(self, "cache_dir"):
            self.cache_dir.release()  # its downloads go with it: the next replica has its own


def replica_cache_parent(settings: Settings) -> Path:
    """Where the engine replicas' own adapter caches live: ``[cluster] replica_data_dir`` (scratch
    on each node) or, by default, beside the configured adapter cache."""
    if settings.cluster.replica_data_dir:
        return Path(settings.cluster.replica_data_dir) / "adapter-cache" / "replicas"
    return cache_root(settings) / "replicas"


def deployment(settings: Settings) -> Any:
    """The Serve deployment of ``EngineReplica`` configured from ``[cluster]``."""
    from ray import serve

    cl = settings.cluster
    options: dict[str, Any] = {
        "name": "engine",
        "ray_actor_options": {"num_cpus": cl.replica_num_cpus, "num_gpus": cl.replica_num_gpus},
        # the engine batches: let it see its whole batch plus a queue, not Serve's default of 5
        "max_ongoing_requests": max(16, 2 * _batch_size(settings)),
        "graceful_shutdown_timeout_s": cl.drain_timeout_s,  # scale-down and rolling restarts drain
        # a rolling restart starts rollout_surge successors before it stops (drains) old replicas
        "max_surge_percent": surge_percent(cl.rollout_surge, cl.replicas),
        "graceful_shutdown_wait_loop_s": 1.0,
        "health_check_period_s": 2.0,
        # check_health is a flag read; a loaded box can still take many seconds to answer it, and
        # three misses replace the replica (its streams cut)
        "health_check_timeout_s": 30.0,
    }
    if cl.routing == "prefix":
        options["request_router_config"] = {  # Serve's RequestRouterConfig fields
            "request_router_class": "loraplex.platform.cluster.routing:PrefixAwareRouter",
            "request_routing_stats_period_s": 1.0,
            "request_routing_stats_timeout_s": 5.0,
        }
    if cl.max_replicas > min(cl.min_replicas, cl.replicas):  # replicas is then the initial count
        options["autoscaling_config"] = {
            "min_replicas": min(cl.min_replicas, cl.replicas),
            "initial_replicas": cl.replicas,
            "max_replicas": cl.max_replicas,
            "target_ongoing_requests": cl.target_ongoing_requests,
            "upscale_delay_s": cl.upscale_delay_s,
            "downscale_delay_s": cl.downscale_delay_s,
        }
    else:
        options["num_replicas"] = cl.replicas
    return serve.deployment(**options)(EngineReplica)


def surge_percent(surge: int, replicas: int) -> int:
    """Serve's ``max_surge_percent`` (of the target count, rounded up to whole replicas) that
    allows ``surge`` extra replicas during a rollout (Serve rounds the percentage up: 34 % of 3
    would be 2, so the percentage is rounded down here)."""
    if surge <= 0:
        return 0
    return max(1, min(100, 100 * surge // max(replicas, 1)))


def _batch_size(settings: Settings) -> int:
    """The replica's ``max_num_seqs``; left to auto-sizing (None, the default), the cap the engine
    would size it to on the replica's device (the driver cannot see the replica's memory)."""
    if settings.engine.max_num_seqs is not None:
        return int(settings.engine.max_num_seqs)
    import torch

    from loraplex.engine import auto_max_num_seqs

    return auto_max_num_seqs(torch.device("cuda" if settings.cluster.replica_num_gpus else "cpu"), None)
