"""/metrics parsed by prometheus-client's own parser, JSON request logs, OpenTelemetry spans
(SDK in-memory exporter), all driven by the official openai client against a real uvicorn."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest
from harness.live import LiveServer
from platform_helpers import admin_headers, make_settings, zip_bytes
from prometheus_client.parser import text_string_to_metric_families

from loraplex.platform.app import build_context, create_app
from loraplex.platform.observability.requests import JSONFormatter, make_tracer

H = admin_headers()


@pytest.fixture
def obs_server(tmp_path, db_url, demo_engine, good_files):
    settings = make_settings(tmp_path, db_url, observability={"tenant_labels": True, "max_label_values": 1})
    ctx, _ = build_context(settings, demo_engine, upgrade_db=False)
    app = create_app(ctx, owns_engine=False)
    srv = LiveServer(app, ctx)
    url = srv.url
    clients = []
    with httpx.Client(base_url=url, headers=H, timeout=30) as c:
        for name in ("acme", "globex"):
            tid = c.post("/admin/v1/tenants", json={"name": name}).json()["id"]
            key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
            clients.append((tid, openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)))
        c.post(
            "/admin/v1/adapters",
            data={"name": "bot", "tenant_id": clients[0][0]},
            files={"file": ("bot.zip", zip_bytes(good_files))},
        )
        yield ctx, url, c, clients
    srv.stop()


def _scrape(url: str) -> dict[str, list]:
    text = httpx.get(url + "/metrics").text
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_metrics_logs_and_traces(obs_server, caplog):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    ctx, url, admin, clients = obs_server
    exporter = InMemorySpanExporter()
    ctx.observer.tracer = make_tracer("", exporter=exporter)
    (acme, a_client), (globex, g_client) = clients
    base = ctx.engine.model_name
    with caplog.at_level(logging.INFO, logger="loraplex.requests"):
        r1 = a_client.completions.create(
            model="bot", prompt="Hello", max_tokens=5, temperature=0, user="u-7", extra_body={"ignore_eos": True}
        )
        r2 = a_client.chat.completions.create(
            model=base,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=3,
            n=2,
            temperature=0.5,
            extra_body={"ignore_eos": True},
        )
        r3 = g_client.completions.create(model=base, prompt="abc", max_tokens=2)
    admin.put(f"/admin/v1/tenants/{globex}/quota", json={"rpm": 1})
    with pytest.raises(openai.RateLimitError):
        g_client.completions.create(model=base, prompt="x", max_tokens=1)

    m = _scrape(url)
    reqs = {
        (s.labels["endpoint"], s.labels["tenant"], s.labels["adapter"]): s.value
        for s in m["loraplex:requests"]
        if s.name.endswith("_total") and s.labels["status"] == "ok"
    }
    # max_label_values=1: the first tenant keeps its id, the second is folded into "other".
    assert reqs == {("completions", acme, "bot"): 1, ("chat.completions", acme, ""): 1, ("completions", "other", ""): 1}
    gen = sum(s.value for s in m["loraplex:generation_tokens"] if s.name.endswith("_total"))
    assert (
        gen
        == r1.usage.completion_tokens + r2.usage.completion_tokens + r3.usage.completion_tokens
        == 5 + 6 + r3.usage.completion_tokens
    )
    prompt = sum(s.value for s in m["loraplex:prompt_tokens"] if s.name.endswith("_total"))
    assert prompt == r1.usage.prompt_tokens + r2.usage.prompt_tokens + r3.usage.prompt_tokens
    ttft_count = sum(s.value for s in m["loraplex:time_to_first_token_seconds"] if s.name.endswith("_count"))
    assert ttft_count == 3
    assert [s.value for s in m["loraplex:rate_limited_requests"] if s.labels.get("reason") == "rpm"] == [1]
    for name in (
        "loraplex:num_requests_running",
        "loraplex:num_requests_waiting",
        "loraplex:kv_cache_usage_perc",
        "loraplex:prefix_cache_hit_rate",
        "loraplex:lora_resident_adapters",
        "loraplex:num_preemptions",
        "loraplex:lora_slot_loads",
    ):
        assert name in m, name
    phases = {s.labels["phase"]: s.value for s in m["loraplex:engine_step_seconds"]}
    assert {"schedule", "forward", "sample"} <= set(phases) and phases["forward"] > 0

    records = [r for r in caplog.records if r.name == "loraplex.requests"]
    assert len(records) == 3
    line = json.loads(JSONFormatter().format(records[0]))
    assert line["request_id"] and line["tenant_id"] == acme and line["adapter"] == "bot" and line["user"] == "u-7"
    assert line["completion_tokens"] == 5 and line["ttft_ms"] > 0 and line["latency_ms"] >= line["ttft_ms"]

    # The admin page's usage series (SQL per backend) agrees with what the clients were told.
    ctx.ledger.flush()
    series = admin.get("/admin/v1/usage/series", params={"by": "tenant", "bucket": "hour"}).json()["data"]
    per_tenant = {p["key"]: p["prompt_tokens"] + p["completion_tokens"] for p in series}
    assert per_tenant[acme] == r1.usage.total_tokens + r2.usage.total_tokens
    assert per_tenant[globex] == r3.usage.total_tokens
    by_adapter = admin.get("/admin/v1/usage/series", params={"by": "adapter", "bucket": "day"}).json()["data"]
    assert {p["key"]: p["requests"] for p in by_adapter} == {"bot": 1, "": 2}
    assert series[0]["time"].endswith("Z") and "T" in series[0]["time"]

    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 3
    root = next(s for s in roots if s.attributes["loraplex.adapter"] == "bot")
    kids = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id}
    assert set(kids) == {"admission", "queue+prefill", "decode"}
    assert root.start_time <= kids["admission"].start_time <= kids["queue+prefill"].start_time
    assert kids["decode"].end_time == root.end_time and root.attributes["gen_ai.usage.output_tokens"] == 5


def test_speculative_stats_are_exported_when_speculation_is_on():
    """The engine collector maps stats()["speculative"] to vLLM-like spec_decode metrics, and
    exports none of them when speculation is off."""
    from prometheus_client.parser import text_string_to_metric_families

    from loraplex.platform.observability.metrics import Metrics

    def render(spec):
        stats = {"enabled": True, "scheduler": {}, "kv_cache": {}, "counters": {}, "speculative": spec}
        text = Metrics(lambda: stats).render()
        text = text.decode() if isinstance(text, bytes) else text
        return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}

    on = render({"proposed_tokens": 40, "accepted_tokens": 30, "acceptance_rate": 0.75, "mean_accepted_length": 2.5})
    assert on["loraplex:spec_decode_num_draft_tokens_total"] == 40
    assert on["loraplex:spec_decode_num_accepted_tokens_total"] == 30
    assert on["loraplex:spec_decode_acceptance_rate"] == 0.75
    assert on["loraplex:spec_decode_mean_accepted_length"] == 2.5
    assert not any("spec_decode" in name for name in render(None))
