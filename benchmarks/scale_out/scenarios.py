"""Scenarios of ``benchmarks/scale_out/bench.py`` beyond adapter routing: multi-turn sessions (prefix
hit rate and TTFT per routing mode), a two-tenant flood across replicas (fairness), the control
plane killed under load and SIGTERM drain (``faults.py``), and autoscaling min 1 / max 2.
Each runs against a real ``loraplex serve`` (``Server`` from scale_out.py) over HTTP."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from pathlib import Path

import httpx

H_KEY = "Authorization"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def one_stream(c: httpx.AsyncClient, body: dict) -> tuple[int, float | None, int, str]:
    """(status, ttft seconds, completion tokens, replica) of one streamed completion."""
    t0 = time.perf_counter()
    first, tokens = None, 0
    async with c.stream(
        "POST", "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    ) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, None, 0, ""
        replica = r.headers.get("x-loraplex-replica", "")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                return 599, first, tokens, replica
            if first is None and ev.get("choices") and ev["choices"][0].get("text"):
                first = time.perf_counter() - t0
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    return 200, first, tokens, replica


def kv_counters(server) -> dict[str, int]:
    eng = httpx.get(server.url + "/admin/v1/engine", headers=server.headers, timeout=10).json()
    reps = eng.get("replicas") or [eng]
    return {k: sum(int(r["kv_cache"][k]) for r in reps) for k in ("prefix_cache_queries", "prefix_cache_hits")}


# ---------------------------------------------------------------------------------- sessions
def sessions(server, key: str, models: list[str], n_sessions: int, turns: int, max_tokens: int) -> dict:
    """Chat sessions of ``turns`` turns, run side by side: each turn's prompt is the session's
    whole history (a unique 96-token system part, then 48 new tokens per turn). TTFT of turns 2+
    is where a replica holding the history wins."""
    rng = random.Random(5)
    hist = [[rng.randrange(100, 600) for _ in range(96)] for _ in range(n_sessions)]
    model_of = [models[i % len(models)] for i in range(n_sessions)]
    before = kv_counters(server)
    ttft_later: list[float] = []
    switches = [0]

    async def session(c: httpx.AsyncClient, i: int) -> None:
        last = ""
        for t in range(turns):
            hist[i] += [rng.randrange(100, 600) for _ in range(48)]
            body = {"model": model_of[i], "prompt": hist[i], "max_tokens": max_tokens, "temperature": 0}
            status, ttft, _tok, replica = await one_stream(c, body)
            if status == 200 and t > 0 and ttft is not None:
                ttft_later.append(ttft)
                switches[0] += bool(last and replica != last)
            last = replica or last

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers={H_KEY: f"Bearer {key}"}, timeout=300) as c:
            await asyncio.gather(*[session(c, i) for i in range(n_sessions)])

    t0 = time.perf_counter()
    asyncio.run(run())
    after = kv_counters(server)
    q = after["prefix_cache_queries"] - before["prefix_cache_queries"]
    h = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    return {
        "wall_s": time.perf_counter() - t0,
        "prefix_hit_rate": h / q if q else 0.0,
        "ttft_later_p50_ms": _pct(ttft_later, 0.5) * 1000,
        "ttft_later_p90_ms": _pct(ttft_later, 0.9) * 1000,
        "replica_switches": switches[0],
        "later_turns": len(ttft_later),
    }


# ------------------------------------------------------------------------------------- flood
def ledger_ttft_ms(db_path: Path, tenant_id: str, after_id: int) -> float:
    """Median TTFT the ingress recorded in the usage ledger (from admission to the first token, so
    without the client's HTTP and the Serve proxy) for ``tenant_id``'s rows after ``after_id``."""
    db = sqlite3.connect(db_path)
    try:
        rows = db.execute(
            "SELECT ttft_ms FROM usage_records WHERE tenant_id = ? AND id > ? AND ttft_ms IS NOT NULL",
            (tenant_id, after_id),
        ).fetchall()
    finally:
        db.close()
    return _pct([r[0] for r in rows], 0.5)


def last_usage_id(db_path: Path) -> int:
    db = sqlite3.connect(db_path)
    try:
        return int(db.execute("SELECT COALESCE(MAX(id), 0) FROM usage_records").fetchone()[0])
    finally:
        db.close()


def flood(
    server,
    flooder: str,
    light: str,
    light_model: str,
    seconds: float,
    max_tokens: int,
    light_streams: int = 8,
    flood_streams: int = 24,
) -> dict:
    """Tenant F floods both replicas (base model, ``flood_streams`` closed-loop streams); tenant L
    runs ``light_streams`` streams of one adapter (adapter affinity keeps L on one replica). With
    8 both stay backlogged and fair means equal tokens/s (Jain); with 2, L is a light tenant and its
    TTFT ÷ F's TTFT shows whether it jumps the flood. Keep ``flood_streams`` per replica below the
    engine deployment's ``max_ongoing_requests``: beyond it requests queue in Serve's router (FIFO,
    outside any fairness)."""
    stop = time.perf_counter() + seconds
    served = {"F": 0, "L": 0}
    ttft: dict[str, list[float]] = {"F": [], "L": []}

    async def loop(c: httpx.AsyncClient, who: str, model: str, i: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            n += 1
            body = {
                "model": model,
                "prompt": f"{who} {i} {n} tell me",
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            status, first, tokens, _ = await one_stream(c, body)
            if status == 200:
                served[who] += tokens
                if first is not None:
                    ttft[who].append(first)

    async def run() -> None:
        cf = httpx.AsyncClient(base_url=server.url, headers={H_KEY: f"Bearer {flooder}"}, timeout=300)
        cl = httpx.AsyncClient(base_url=server.url, headers={H_KEY: f"Bearer {light}"}, timeout=300)
        async with cf, cl:
            await asyncio.gather(
                *[loop(cf, "F", "demo", i) for i in range(flood_streams)],
                *[loop(cl, "L", light_model, i) for i in range(light_streams)],
            )

    t0 = time.perf_counter()
    asyncio.run(run())
    wall = time.perf_counter() - t0
    x = [served["F"] / wall, served["L"] / wall]
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if any(x) else float("nan")
    return {
        "wall_s": wall,
        "flooder_tok_s": x[0],
        "light_tok_s": x[1],
        "jain": jain,
        "light_ttft_p50_ms": _pct(ttft["L"], 0.5) * 1000,
        "flooder_ttft_p50_ms": _pct(ttft["F"], 0.5) * 1000,
        "ttft_ratio": _pct(ttft["L"], 0.5) / _pct(ttft["F"], 0.5) if ttft["F"] and ttft["L"] else float("nan"),
    }


# --------------------------------------------------------------------------------- autoscale
def autoscale(server, key: str, max_tokens: int, load_s: float) -> dict:
    """min 1 / max 2, starting at 2: one stream at a time (idle) until Serve scales down to 1,
    then 16 closed-loop streams until it scales up to 2 (at least ``load_s``), then one stream
    again until it is back at 1. Reports when each change was seen and whether any stream was cut
    (a scale-down drains the replica it stops)."""
    seen: list[tuple[float, int]] = []
    cut = [0]
    done = [0]
    t0 = time.perf_counter()
    phase = ["idle"]
    marks: dict[str, float] = {}

    def count() -> int:
        try:
            eng = httpx.get(server.url + "/admin/v1/engine", headers=server.headers, timeout=30).json()
            return int(eng["replica_count"])
        except (httpx.HTTPError, ValueError, KeyError):
            return -1

    async def watcher() -> None:
        deadline = time.perf_counter() + 900
        while time.perf_counter() < deadline and phase[0] != "end":
            n = await asyncio.to_thread(count)
            now = round(time.perf_counter() - t0, 1)
            seen.append((now, n))
            if phase[0] == "idle" and n == 1:
                marks["down_idle"] = now
                phase[0], marks["load_from"] = "load", now
            elif phase[0] == "load" and n == 2 and now - marks["load_from"] >= load_s:
                marks["up"] = next((t for t, c in seen if t >= marks["load_from"] and c == 2), now)
                phase[0] = "cool"
            elif phase[0] == "cool" and n == 1:
                marks["down"] = now
                phase[0] = "end"
            await asyncio.sleep(2)
        phase[0] = "end"

    async def loop(c: httpx.AsyncClient, i: int) -> None:
        n = 0
        while phase[0] != "end":
            if i > 0 and phase[0] != "load":
                await asyncio.sleep(0.5)
                continue
            n += 1
            body = {"model": "demo", "prompt": f"a {i} {n}", "max_tokens": max_tokens, "ignore_eos": True}
            status, _f, tokens, _ = await one_stream(c, body)
            done[0] += 1
            cut[0] += status != 200 or tokens != max_tokens

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers={H_KEY: f"Bearer {key}"}, timeout=300) as c:
            await asyncio.gather(watcher(), *[loop(c, i) for i in range(16)])

    asyncio.run(run())
    return {
        "max_replicas_seen": max(n for _, n in seen),
        "scaled_down_idle_at_s": marks.get("down_idle"),
        "scaled_up_at_s": marks.get("up"),
        "scaled_down_at_s": marks.get("down"),
        "requests": done[0],
        "cut_or_failed": cut[0],
        "timeline": seen,
    }
