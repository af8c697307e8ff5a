"""Synthetic serving workloads and the engine driver shared by the benchmarks.

Every benchmark replays a list of ``Arrival``s (time offset, prompt, output length, adapter,
tenant) against a system and records per-request timestamps, so all systems are measured the same
way: TTFT = first token - arrival, TPOT = (finish - first token) / (output tokens - 1).
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.lib.paths import RESULTS

RESULTS_DIR = RESULTS


@dataclass
class Arrival:
    t: float  # seconds after the start
    prompt: list[int]
    max_tokens: int
    adapter: str | None = None
    tenant: str = "default"


@dataclass
class Record:
    arrival: float
    first_token: float
    finish: float
    output_tokens: int
    prompt_tokens: int
    tenant: str = "default"


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def heavy_tailed_lengths(n: int, rng: random.Random, short=(4, 16), long=(200, 400), p_long=0.1) -> list[int]:
    """Bimodal: most outputs short, a fixed share 10-100x longer."""
    return [rng.randint(*long) if rng.random() < p_long else rng.randint(*short) for _ in range(n)]


def pareto_lengths(n: int, rng: random.Random, alpha: float = 1.1, minimum: int = 4, cap: int = 512) -> list[int]:
    """Power-law (bounded Pareto) output lengths: with the defaults the median is ~7 tokens, ~8% exceed
    40 and ~0.6% exceed 400 — most answers short, a few 10-100x longer, with no fixed gap between."""
    return [min(cap, int(minimum * rng.random() ** (-1.0 / alpha))) for _ in range(n)]


def drive_engine(engine, arrivals: list[Arrival], params_for) -> list[Record]:
    """Replay arrivals in real time against an LLMEngine until every request has finished."""
    records, _ = _replay(engine, arrivals, params_for, horizon=None)
    return [records[i] for i in range(len(arrivals))]


def drive_engine_for(engine, arrivals: list[Arrival], params_for, horizon: float) -> tuple[list[Record], int]:
    """Replay arrivals for ``horizon`` seconds, then stop. Returns the requests that finished in time
    and the output tokens generated within the horizon (finished or not): the sustained service rate
    of an overloaded system, free of the end-of-run tail that a finite workload ends with."""
    records, tokens = _replay(engine, arrivals, params_for, horizon=horizon)
    return [records[i] for i in sorted(records)], tokens


def _replay(engine, arrivals: list[Arrival], params_for, horizon: float | None) -> tuple[dict[int, Record], int]:
    pending = sorted(range(len(arrivals)), key=lambda i: arrivals[i].t)
    start = time.monotonic()
    tokens_before = engine.counters["generated_tokens"]
    ids: dict[str, int] = {}
    done: dict[int, Record] = {}
    nxt = 0
    while len(done) < len(arrivals):
        now = time.monotonic() - start
        if horizon is not None and now >= horizon:
            break
        while nxt < len(pending) and arrivals[pending[nxt]].t <= now:
            i = pending[nxt]
            a = arrivals[i]
            req = engine.add_request(
                a.prompt, params_for(a), adapter=a.adapter, tenant_id=a.tenant, arrival_time=start + a.t
            )
            ids[req.request_id] = i
            nxt += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[pending[nxt]].t - (time.monotonic() - start)))
            continue
        for out in engine.step():
            if out.finished:
                m = out.metrics
                i = ids[out.request_id]
                done[i] = Record(
                    m["arrival_time"] - start,
                    m["first_token_time"] - start,
                    m["finish_time"] - start,
                    len(out.token_ids),
                    len(out.prompt_token_ids),
                    arrivals[i].tenant,
                )
    return done, engine.counters["generated_tokens"] - tokens_before


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(name: str, records: list[Record], extra: dict | None = None) -> dict:
    span = max(r.finish for r in records) - min(r.arrival for r in records)
    out_tokens = sum(r.output_tokens for r in records)
    ttft = [r.first_token - r.arrival for r in records]
    tpot = [(r.finish - r.first_token) / (r.output_tokens - 1) for r in records if r.output_tokens > 1]
    return {
        "system": name,
        "requests": len(records),
        "duration_s": span,
        "req_per_s": len(records) / span,
        "output_tok_per_s": out_tokens / span,
        "ttft_p50_ms": 1000 * pct(ttft, 0.5),
        "ttft_p99_ms": 1000 * pct(ttft, 0.99),
        "tpot_p50_ms": 1000 * pct(tpot, 0.5),
        "tpot_p99_ms": 1000 * pct(tpot, 0.99),
        "ttft_mean_ms": 1000 * statistics.fmean(ttft),
        **(extra or {}),
    }


def summarize_window(
    name: str, records: list[Record], output_tokens: int, horizon: float, extra: dict | None = None
) -> dict:
    """Like ``summarize`` for a run cut at ``horizon`` seconds: throughput is what was generated in
    the window; latencies are over the requests that finished inside it."""
    row = summarize(name, records, extra) if records else {"system": name, **(extra or {})}
    row.update(
        {
            "duration_s": horizon,
            "requests": len(records),
            "req_per_s": len(records) / horizon,
            "output_tok_per_s": output_tokens / horizon,
            "output_tokens": output_tokens,
        }
    )
    return row


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return "" if v is None else str(v)


def write_json(name: str, payload: dict) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"machine": {"cpus": os.cpu_count()}, **payload}
    path.write_text(
        json.dumps(payload, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
    )
    return path
