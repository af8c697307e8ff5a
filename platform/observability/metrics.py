"""Prometheus metrics, named like vLLM's where the meaning is the same, with a ``loraplex:`` prefix.

Request metrics are observed when a request ends (one call from the request path); engine state
(running/waiting sequences, KV blocks, prefix cache, adapters, preemptions, step-time split) is
read from the engine's stats at scrape time by a custom collector, so the step loop pays nothing.
Each app has its own registry (several apps can live in one process, as in tests).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
OTHER = "other"


@dataclass
class FinishedRequest:
    request_id: str
    endpoint: str
    status: str  # ok | error | aborted
    tenant_id: str
    adapter: str | None
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None
    latency_s: float
    admission_s: float = 0.0
    user: str | None = None
    start_unix: float = 0.0  # wall clock at the request's start (for trace spans)


class BoundedLabel:
    """At most ``limit`` distinct values; later ones become "other" (bounded cardinality)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self._limit:
                self._seen.add(value)
                return value
        return OTHER


class Metrics:
    def __init__(self, stats: Callable[[], dict[str, Any]], tenant_labels: bool = False, max_label_values: int = 100):
        self.registry = CollectorRegistry(auto_describe=True)
        self.tenant_labels = tenant_labels
        self._tenant = BoundedLabel(max_label_values)
        self._adapter = BoundedLabel(max_label_values)
        extra = ["tenant", "adapter"] if tenant_labels else []
        r = self.registry
        self.requests = Counter(
            "loraplex:requests",
            "Requests that ended, by endpoint and status",
            ["endpoint", "status", *extra],
            registry=r,
        )
        self.prompt_tokens = Counter("loraplex:prompt_tokens", "Prompt tokens processed", extra, registry=r)
        self.generation_tokens = Counter("loraplex:generation_tokens", "Tokens generated", extra, registry=r)
        self.ttft = Histogram(
            "loraplex:time_to_first_token_seconds", "Time to first token", extra, buckets=LATENCY_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "loraplex:time_per_output_token_seconds",
            "Time per output token after the first",
            extra,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "loraplex:e2e_request_latency_seconds",
            "End-to-end request latency",
            extra,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rate_limited = Counter(
            "loraplex:rate_limited_requests", "Requests refused with 429, by reason", ["reason"], registry=r
        )
        r.register(_EngineCollector(stats))

    def _labels(self, tenant: str, adapter: str | None) -> dict[str, str]:
        if not self.tenant_labels:
            return {}
        return {"tenant": self._tenant(tenant), "adapter": self._adapter(adapter) if adapter else ""}  # "": base

    def observe(self, rec: FinishedRequest) -> None:
        lab = self._labels(rec.tenant_id, rec.adapter)
        self.requests.labels(endpoint=rec.endpoint, status=rec.status, **lab).inc()
        (self.prompt_tokens.labels(**lab) if lab else self.prompt_tokens).inc(rec.prompt_tokens)
        (self.generation_tokens.labels(**lab) if lab else self.generation_tokens).inc(rec.completion_tokens)
        (self.e2e.labels(**lab) if lab else self.e2e).observe(rec.latency_s)
        if rec.ttft_s is not None:
            (self.ttft.labels(**lab) if lab else self.ttft).observe(rec.ttft_s)
            if rec.completion_tokens > 1:
                tpot = (rec.latency_s - rec.ttft_s) / (rec.completion_tokens - 1)
                (self.tpot.labels(**lab) if lab else self.tpot).observe(max(tpot, 0.0))

    def observe_rate_limited(self, message: str, code: str | None) -> None:
        self.rate_limited.labels(reason=rate_limit_reason(message, code)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def rate_limit_reason(message: str, code: str | None) -> str:
    if code == "insufficient_quota":
        return "token_budget"
    for key, reason in (("concurrent", "concurrency"), ("requests per minute", "rpm"), ("tokens per minute", "tpm")):
        if key in message:
            return reason
    return "other"


class _EngineCollector(Collector):
    """Engine gauges and counters, read from ``stats()`` (the gateway's) at scrape time."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def describe(self) -> list:
        return []  # the families depend on whether an engine runs: nothing to pre-register

    def collect(self) -> Iterator[Any]:
        try:
            s = self._stats()
        except Exception:  # a scrape must never fail because the engine is busy or gone
            return
        if not s.get("enabled"):
            return
        sched, kv, counters = s.get("scheduler", {}), s.get("kv_cache", {}), s.get("counters", {})
        lora = s.get("lora") or {}

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"loraplex:{name}", doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"loraplex:{name}", doc, value=value)

        yield gauge("num_requests_running", "Sequences in the running batch", sched.get("num_running", 0))
        yield gauge("num_requests_waiting", "Sequences waiting to be scheduled", sched.get("num_waiting", 0))
        yield gauge("kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)", kv.get("usage", 0.0))
        yield gauge("kv_cache_blocks_used", "KV blocks in use", kv.get("used_blocks", 0))
        yield gauge("kv_cache_blocks_total", "KV blocks in the pool", kv.get("num_blocks", 0))
        yield counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache", kv.get("prefix_cache_queries", 0)
        )
        yield counter("prefix_cache_hits", "Prompt tokens served from the prefix cache", kv.get("prefix_cache_hits", 0))
        yield gauge(
            "prefix_cache_hit_rate", "Prefix cache hits / queries since start", kv.get("prefix_cache_hit_rate", 0.0)
        )
        yield counter("num_preemptions", "Sequences preempted (recomputed later)", counters.get("preemptions", 0))
        yield counter("engine_steps", "Engine steps run", counters.get("steps", 0))
        steps = CounterMetricFamily("loraplex:engine_step_seconds", "Engine step time by phase", labels=["phase"])
        for phase, secs in (s.get("step_seconds") or {}).items():
            steps.add_metric([phase], secs)
        yield steps
        yield gauge("lora_resident_adapters", "Adapters in device slots", len(lora.get("resident", {})))
        yield gauge("lora_registered_adapters", "Adapters registered with the engine", len(lora.get("registered", [])))
        for key, doc in (
            ("disk_loads", "Adapter loads from disk"),
            ("slot_loads", "Adapter loads into device slots"),
            ("slot_evictions", "Adapters evicted from device slots"),
            ("cpu_evictions", "Adapters evicted from the host cache"),
        ):
            yield counter(f"lora_{key}", doc, lora.get(key, 0))
        spec = s.get("speculative")
        if spec:  # speculative decoding is on: what it proposes and what the target keeps
            yield counter("spec_decode_num_draft_tokens", "Draft tokens proposed", spec.get("proposed_tokens", 0))
            yield counter(
                "spec_decode_num_accepted_tokens", "Draft tokens accepted by the target", spec.get("accepted_tokens", 0)
            )
            yield gauge(
                "spec_decode_acceptance_rate", "Accepted / proposed since start", spec.get("acceptance_rate", 0.0)
            )
            yield gauge(
                "spec_decode_mean_accepted_length",
                "Tokens emitted per verification (accepted drafts + the target's own)",
                spec.get("mean_accepted_length", 0.0),
            )
        so = s.get("structured_output") or {}
        yield counter("grammar_compilations", "Structured-output grammars compiled", so.get("compiled", 0))
        yield counter("grammar_cache_hits", "Structured-output grammar cache hits", so.get("cache_hits", 0))
