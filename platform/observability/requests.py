"""What happens when a request ends: metrics, one structured log line, and (when an OTLP endpoint
is configured) one trace span with admission / queue+prefill / decode children."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from loraplex.platform.observability.metrics import FinishedRequest, Metrics

log = logging.getLogger("loraplex.requests")


class RequestObserver:
    def __init__(self, metrics: Metrics | None, tracer: Any = None) -> None:
        self.metrics = metrics
        self.tracer = tracer

    def finished(self, rec: FinishedRequest) -> None:
        if self.metrics is not None:
            self.metrics.observe(rec)
        log.info(
            "request finished",
            extra={
                "request": {
                    "request_id": rec.request_id,
                    "http_request_id": rec.http_request_id,
                    "endpoint": rec.endpoint,
                    "status": rec.status,
                    "tenant_id": rec.tenant_id,
                    "adapter": rec.adapter,
                    "user": rec.user,
                    "prompt_tokens": rec.prompt_tokens,
                    "completion_tokens": rec.completion_tokens,
                    "admission_ms": round(rec.admission_s * 1000, 3),
                    "ttft_ms": round(rec.ttft_s * 1000, 3) if rec.ttft_s is not None else None,
                    "latency_ms": round(rec.latency_s * 1000, 3),
                }
            },
        )
        if self.tracer is not None:
            _span(self.tracer, rec)

    def rate_limited(self, message: str, code: str | None, tenant: str | None = None) -> None:
        if self.metrics is not None:
            self.metrics.observe_rate_limited(message, code, tenant)


def _span(tracer: Any, rec: FinishedRequest) -> None:
    """Spans are written after the fact from the measured times (the request path stays untouched)."""
    ns = 1_000_000_000
    start = int((rec.start_unix or time.time() - rec.latency_s - rec.admission_s) * ns)
    admitted = start + int(rec.admission_s * ns)
    first = admitted + int(rec.ttft_s * ns) if rec.ttft_s is not None else None
    end = admitted + int(rec.latency_s * ns)
    attrs = {
        "loraplex.request_id": rec.request_id,
        "loraplex.endpoint": rec.endpoint,
        "loraplex.status": rec.status,
        "loraplex.tenant_id": rec.tenant_id,
        "loraplex.adapter": rec.adapter or "",
        "gen_ai.usage.input_tokens": rec.prompt_tokens,
        "gen_ai.usage.output_tokens": rec.completion_tokens,
    }
    root = tracer.start_span(f"loraplex {rec.endpoint}", start_time=start, attributes=attrs)
    try:
        from opentelemetry import trace

        ctx = trace.set_span_in_context(root)
        for name, a, b in (("admission", start, admitted), ("queue+prefill", admitted, first), ("decode", first, end)):
            if a is not None and b is not None:
                tracer.start_span(name, context=ctx, start_time=a).end(end_time=b)
    finally:
        root.end(end_time=end)


def make_tracer(endpoint: str, exporter: Any = None) -> Any:
    """A tracer exporting to ``endpoint`` over OTLP/HTTP (or to ``exporter``, for tests); None when
    tracing is off. Needs the optional ``opentelemetry-sdk`` and OTLP exporter packages."""
    if not endpoint and exporter is None:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "loraplex"}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("loraplex")


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the request fields if any."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        req = getattr(record, "request", None)
        if isinstance(req, dict):
            out.update(req)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_json_logs(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
