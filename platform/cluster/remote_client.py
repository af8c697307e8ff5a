"""``RemoteEngineClient``: the ``EngineClient`` of an ingress replica, whose engines are the Serve
engine deployment. It composes what an ingress needs to admit a request on its own, so the
request path makes no blocking cluster call for them:

- the base model's tokenizer and the engine's grammar compiler (``structured_output``), built here
  from the same model directory the replicas load: ``response_format`` json_schema and named
  ``tool_choice`` are compiled (and a bad schema refused) before any quota is reserved;
- a ``ClusterView`` refreshed by one background thread: the replicas' reports (``max_model_len``,
  stats, liveness), whether the deployment drains, and the admin aborts other ingresses issued;
- tenant/adapter changes go to the control-plane actor, which every replica pulls from; the version
  each request was admitted under travels with it, so no replica serves it on older state.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loraplex.platform.adapters.sources.uri import AdapterReference
from loraplex.platform.cluster.actor_calls import call_actor
from loraplex.platform.cluster.messages import (
    AbortMatch,
    ControlStatus,
    GenerateRequest,
    ReplicaReport,
    Snapshot,
    StoredAdapter,
    TenantSettings,
)
from loraplex.platform.cluster.remote_stream import RemoteStream, ReplicaCall
from loraplex.platform.engine_client import shared
from loraplex.platform.engine_client.protocol import AdapterFacts, EngineStats
from loraplex.platform.errors import ServiceUnavailable
from loraplex.platform.settings import Settings, engine_config_kwargs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from loraplex.engine import FairGroup, SamplingParams
    from loraplex.platform.cluster.quota_store import ActorQuotaStore
    from loraplex.platform.inference.inflight import InflightRegistry

log = logging.getLogger("loraplex.platform.cluster")


class ClusterView:
    """What the control plane last said (one ``snapshot`` call per tick, from one thread)."""

    def __init__(self) -> None:
        self.replicas: list[ReplicaReport] = []
        self.draining = False
        self.epoch = ""
        self.abort_seq = 0
        self.control: ControlStatus | None = None
        self.fresh = threading.Event()  # set once a snapshot arrived


class AbortBroadcast:
    """An admin abort issued on this ingress reaches the other ingresses at their next tick (the
    in-flight registry's ``peers``)."""

    def __init__(self, control: Any) -> None:
        self._control = control

    def __call__(self, reason: str, match: dict[str, str | None]) -> None:
        m = AbortMatch(match.get("tenant_id"), match.get("key_id"), match.get("adapter_id"))
        self._control.broadcast_abort.remote(reason, m)


class RemoteEngineClient:
    """``engine_handle``: the Serve engine deployment's handle; ``control``: the control plane's
    Ray actor handle. ``name``: this ingress as the control plane knows it (its Serve actor name:
    its reservations live on that name's lease); ``quotas`` is told about a restarted control
    plane, and admin aborts from other ingresses land in ``inflight``. ``start()`` starts the
    poller once the rest of the ingress is built."""

    def __init__(
        self,
        settings: Settings,
        engine_handle: Any,
        control: Any,
        model_dir: Path,
        *,
        name: str,
        quotas: ActorQuotaStore | None = None,
        inflight: InflightRegistry | None = None,
    ) -> None:
        from loraplex.engine import load_tokenizer  # the engine's own loader: same ids

        self._settings = settings
        self._handle = engine_handle
        self._control = control
        self._model_dir = model_dir
        self._chunk_timeout_s = settings.cluster.chunk_timeout_s
        # the adapter as Serve's multiplexed id: Serve's own affinity, or residency for "prefix"
        self._affinity = settings.cluster.routing in ("affinity", "prefix")
        self._version = 0
        self._lock = threading.Lock()
        self._adapters: dict[str, str] = {}
        self._live: dict[str, RemoteStream] = {}
        # Loaded now, at the ingress's start: a lazy first load from several request threads at
        # once races inside transformers' lazy imports ("cannot import name AutoTokenizer").
        self._tokenizer: PreTrainedTokenizerBase = load_tokenizer(settings.engine.tokenizer or str(model_dir))
        self._structured = shared.structured_compiler(self._tokenizer, model_dir)
        self._max_prompt_chars: int | None = None
        self.view = ClusterView()
        self.name = name
        self._quotas = quotas
        self._inflight = inflight
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="loraplex-cluster-view", daemon=True)

    def start(self) -> None:
        """Poll the control plane from now on (one snapshot per ``sync_interval_s``)."""
        self._poller.start()

    # -- the cluster view ------------------------------------------------------------------------
    def _poll(self) -> None:
        interval = self._settings.cluster.sync_interval_s
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - the control plane restarting: next tick
                log.warning("%s: control plane snapshot failed: %s", self.name, exc)
            self._stop.wait(interval)

    def refresh(self) -> None:
        """One snapshot (blocking: the poller's thread, or a worker thread)."""
        in_flight = self._inflight.count() if self._inflight is not None else 0
        snap = call_actor(lambda: self._control.snapshot.remote(self.name, in_flight, self.view.abort_seq))
        assert isinstance(snap, Snapshot)
        view = self.view
        view.replicas, view.draining, view.epoch = snap.replicas, snap.draining, snap.epoch
        view.control = snap.control
        if self._quotas is not None:
            self._quotas.saw_epoch(snap.epoch, readopt=snap.readopt)
        for abort in snap.aborts:
            if self._inflight is not None:
                m = abort.match
                self._inflight.abort(
                    self,
                    abort.reason,
                    tenant_id=m.tenant_id,
                    key_id=m.key_id,
                    adapter_id=m.adapter_id,
                    broadcast=False,
                )
        view.abort_seq = max(view.abort_seq, snap.abort_seq)
        view.fresh.set()

    def _replicas(self) -> list[ReplicaReport]:
        if not self.view.fresh.is_set():
            self.refresh()  # before the poller's first tick (start-up)
        return self.view.replicas

    # -- what the platform reads -----------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        return True

    @property
    def alive(self) -> bool:
        try:
            return any(r.running for r in self._replicas())
        except Exception:  # noqa: BLE001 - no control plane, nothing is alive
            return False

    @property
    def replica_name(self) -> str:
        return ""  # each stream names the replica that served it

    @property
    def model_dir(self) -> Path | None:
        return self._model_dir

    @property
    def model_name(self) -> str:
        return self._model_dir.name

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """The smallest context any replica reports (they share one config; a replica starting
        with another device may size differently, and a request must fit wherever it lands)."""
        lens = [r.max_model_len for r in self._replicas() if r.max_model_len is not None]
        if not lens:
            raise ServiceUnavailable("no engine replica has reported yet", headers={"retry-after": "5"})
        return min(lens)

    def max_prompt_chars(self) -> int | None:
        if self._max_prompt_chars is None:
            try:
                self._max_prompt_chars = shared.max_prompt_chars(self._tokenizer, self.max_model_len)
            except ServiceUnavailable:
                return None  # the replicas still check the token length
        return self._max_prompt_chars

    def resolved_config(self) -> dict[str, object]:
        return dict(engine_config_kwargs(self._settings.engine))

    def shutdown(self) -> None:  # the replicas belong to Serve
        self._stop.set()
        for stream in list(self._live.values()):
            stream.cancel()

    # -- requests ----------------------------------------------------------------------------------
    def check_sampling(self, params: SamplingParams, *, tenant_id: str | None) -> None:
        shared.check_sampling(params, tenant_id, self._structured)

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        adapter: str | None,
        tenant_id: str,
        cache_salt: str | None,
        fair_group: FairGroup | None = None,
    ) -> RemoteStream:
        if self.view.draining:
            raise ServiceUnavailable("the server is shutting down", code="shutting_down", headers={"retry-after": "5"})
        req = GenerateRequest(
            prompt_ids=list(prompt_token_ids),
            params=params,
            request_id=request_id,
            tenant_id=tenant_id,
            cache_salt=cache_salt,
            version=self._version,
            adapter=adapter,
            fair_group=fair_group,
        )
        mux = (adapter or "") if self._affinity else ""
        stream = RemoteStream(self._call, self._done, req, mux, self._chunk_timeout_s)
        self._live[request_id] = stream
        return stream

    def abort(self, request_id: str) -> None:
        stream = self._live.get(request_id)
        if stream is not None:
            stream.cancel()

    def _done(self, request_id: str) -> None:
        self._live.pop(request_id, None)

    def _call(self, req: GenerateRequest, adapter: str) -> ReplicaCall:
        return self._handle.options(stream=True, multiplexed_model_id=adapter).generate.remote(req)

    # -- tenants and adapters: into the control plane, pulled by every replica ---------------------
    def _bump(self, version: object) -> None:
        assert isinstance(version, int)
        with self._lock:
            self._version = max(self._version, version)

    def set_tenant(self, tenant_id: str, priority: int, weight: float, max_running_seqs: int | None) -> None:
        settings = TenantSettings(priority, weight, max_running_seqs)
        self._bump(call_actor(lambda: self._control.set_tenant.remote(tenant_id, settings)))

    def validate_adapter(self, path: Path) -> AdapterFacts:
        return shared.validate_adapter(path, self._model_dir, self._settings.engine.max_lora_rank)

    def add_adapter(self, key: str, path: Path) -> None:
        self._bump(call_actor(lambda: self._control.add_adapter.remote(key, StoredAdapter(str(path)))))
        with self._lock:
            self._adapters[key] = str(path)

    def resolves_references(self) -> bool:
        return True  # each engine replica fetches into its own cache (replica.py): nothing here

    def add_adapter_reference(self, key: str, ref: AdapterReference) -> None:
        self._bump(call_actor(lambda: self._control.add_adapter.remote(key, ref)))
        with self._lock:
            self._adapters[key] = str(ref)

    def remove_adapter(self, key: str) -> None:
        with self._lock:
            self._adapters.pop(key, None)
        self._bump(call_actor(lambda: self._control.remove_adapter.remote(key)))

    def registered_adapters(self) -> list[str]:
        with self._lock:
            return sorted(self._adapters)

    def stats(self) -> EngineStats:
        replicas = [r.as_json() for r in self._replicas()]
        first = replicas[0] if replicas else {}
        control = self.view.control
        return {
            "enabled": True,
            "model": self.model_name,
            "mode": "ray-serve",
            **first,
            "replica_count": len(replicas),
            "replicas": replicas,
            "draining": self.view.draining,
            "control": control.as_json() if control is not None else {},
        }
