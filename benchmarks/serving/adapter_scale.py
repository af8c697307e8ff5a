"""Thousands of adapters where they live: registered by reference in an S3-compatible store (moto's
standalone server on loopback), fetched on first use, Zipf(1.1) traffic, 16 streams in flight.

One process, one database (SQLite), the demo model with random weights (tiny shapes):
  1. N distinct PEFT adapters (one real PEFT adapter, N seeded perturbations of its weights) are
     put into the store and registered by URI through the admin API of a "registrar" server
     (validation only: no engine).
  2. A serving server with its own, empty disk cache (another node, in effect) takes R streaming
     completions, Zipf(1.1) over the N adapters, 16 in flight. A request is "cold" when it is the
     first of its adapter in the run (store -> disk cache -> engine -> first token), "warm" otherwise.
  3. The same traffic over 8 adapters, before and after, on the same server: throughput ratio.

Reported: TTFT p50/p90 cold vs warm, hits per tier (engine device slots, host LRU, disk cache,
store downloads), downloads per 1,000 requests, host-tier and disk-cache bytes (peak) next to their
budgets, requests/s of N adapters vs 8.

    .venv/bin/python -m benchmarks.serving.adapter_scale --adapters 1000 --requests 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.lib.paths import RESULTS
from tests.harness.adapters import make_peft_adapter
from tests.harness.live import LiveServer
from tests.harness.s3 import CREDENTIALS, MotoServer

ADMIN_KEY = "lpx-admin-benchmark-key-0123456789"
SECRET = "b" * 40


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def make_adapters(base: Path, root: Path, n: int) -> list[dict[str, bytes]]:
    """N distinct adapters: one PEFT adapter, then N seeded perturbations of its LoRA weights."""
    import torch
    from safetensors.torch import load, save

    make_peft_adapter(base, root / "seed", r=8, alpha=16, targets=("q_proj", "v_proj"))
    config = (root / "seed" / "adapter_config.json").read_bytes()
    weights = load((root / "seed" / "adapter_model.safetensors").read_bytes())
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        varied = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in weights.items()}
        out.append({"adapter_config.json": config, "adapter_model.safetensors": save(varied)})
    return out


def zipf_weights(n: int, s: float) -> list[float]:
    w = [1.0 / (k**s) for k in range(1, n + 1)]
    total = sum(w)
    return [x / total for x in w]


async def drive(url: str, key: str, models: list[str], weights: list[float], requests: int, in_flight: int, seed: int):
    """Streaming completions, ``in_flight`` at a time; returns per request (model, ttft_s, ok)."""
    import httpx

    rng = random.Random(seed)
    picks = rng.choices(models, weights=weights, k=requests)
    results: list[tuple[str, float, bool, str]] = []
    queue: asyncio.Queue[str] = asyncio.Queue()
    for m in picks:
        queue.put_nowait(m)
    headers = {"Authorization": f"Bearer {key}"}

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            model = queue.get_nowait()
            body = {
                "model": model,
                "prompt": "hello world, tell me",
                "max_tokens": 8,
                "stream": True,
                "ignore_eos": True,
            }
            t0 = time.perf_counter()
            ttft, ok, err = float("nan"), False, ""
            async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    err = (await r.aread()).decode()[:200]
                else:
                    errored = False
                    async for line in r.aiter_lines():
                        if line.startswith("data:") and ttft != ttft:
                            ttft = time.perf_counter() - t0
                        if line.startswith("data:") and '"error"' in line:
                            errored, err = True, line[:200]  # an SSE error event (the engine failed it)
                        if line.strip() == "data: [DONE]":
                            ok = not errored
            results.append((model, ttft, ok, err))

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(in_flight)))
        wall = time.perf_counter() - t0
    return results, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapters", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--small-requests", type=int, default=300, help="requests of each 8-adapter run")
    ap.add_argument("--in-flight", type=int, default=16)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--disk-budget-fraction", type=float, default=0.25, help="disk cache budget / all adapters")
    ap.add_argument("--max-cpu-loras", type=int, default=32)
    ap.add_argument("--max-loras", type=int, default=8)
    args = ap.parse_args()
    os.environ.update(CREDENTIALS)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import httpx

    from loraplex.engine.demo_model import ensure_demo_model
    from loraplex.platform.app import build_context, create_app
    from loraplex.platform.engine_client import LocalEngineClient
    from loraplex.platform.settings import load_settings

    tmp = Path(tempfile.mkdtemp(prefix="adapter-scale-"))
    base = Path(ensure_demo_model(tmp / "model"))
    moto = MotoServer(tmp)
    servers: list[LiveServer] = []
    try:
        t0 = time.perf_counter()
        adapters = make_adapters(base, tmp / "peft", args.adapters)
        per_adapter = sum(len(b) for b in adapters[0].values())
        s3 = moto.client()
        s3.create_bucket(Bucket="adapters")
        for i, files in enumerate(adapters):
            for name, data in files.items():
                s3.put_object(Bucket="adapters", Key=f"lora-{i:04d}/{name}", Body=data)
        t_store = time.perf_counter() - t0
        db = f"sqlite:///{tmp / 'bench.db'}"
        common = dict(database_url=db, admin_key=ADMIN_KEY, secret_key=SECRET, environment="development")
        engine = {
            "model": str(base),
            "dtype": "float32",
            "max_num_seqs": 16,
            "max_loras": args.max_loras,
            "max_cpu_loras": args.max_cpu_loras,
            "max_lora_rank": 16,
            "kv_cache_memory_gb": 0.1,
        }
        disk_budget = int(args.disk_budget_fraction * per_adapter * args.adapters)
        src = {"s3_endpoint_url": moto.url, "fetch_timeout_s": 60.0}
        reg_settings = load_settings(
            data_dir=tmp / "registrar", engine={**engine, "enabled": False}, adapters=src, **common
        )
        reg_ctx, _ = build_context(reg_settings, LocalEngineClient.validator_only(reg_settings))
        registrar = LiveServer(create_app(reg_ctx, owns_engine=False), reg_ctx)
        servers.append(registrar)
        admin = httpx.Client(base_url=registrar.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=120)
        tid = admin.post("/admin/v1/tenants", json={"name": "bench"}).json()["id"]
        key = admin.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
        t0 = time.perf_counter()
        names = []
        for i in range(args.adapters):
            r = admin.post(
                "/admin/v1/adapters",
                json={"name": f"lora-{i:04d}", "source": f"s3://adapters/lora-{i:04d}/", "visibility": "shared"},
            )
            assert r.status_code == 201, r.text
            names.append(f"lora-{i:04d}")
        t_register = time.perf_counter() - t0

        serve_settings = load_settings(
            data_dir=tmp / "node",
            engine=engine,
            adapters={**src, "cache_max_bytes": disk_budget},
            **common,
        )
        node_ctx, _ = build_context(serve_settings, upgrade_db=False)
        node = LiveServer(create_app(node_ctx, owns_engine=True), node_ctx)
        servers.append(node)
        peaks = {"host_bytes": 0, "disk_bytes": 0}
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.2):
                lora = node_ctx.engine.stats().get("lora", {})
                peaks["host_bytes"] = max(peaks["host_bytes"], int(lora.get("cpu_cached_bytes", 0)))
                peaks["disk_bytes"] = max(peaks["disk_bytes"], node_ctx.sources.resolver.cache.used_bytes)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        def counters() -> dict:
            lora = node_ctx.engine.stats().get("lora", {})
            res = node_ctx.sources.resolver.stats()
            keys = (
                "slot_hits",
                "slot_loads",
                "cpu_hits",
                "disk_loads",
                "prefetches",
                "prefetch_ready",
                "prefetch_waits",
            )
            return {
                **{k: int(lora.get(k, 0)) for k in keys},
                "downloads": res["downloads"],
                "disk_cache_hits": res["cache_hits"],
                "disk_evictions": res["disk_cache"]["evictions"],
                "engine_errors": int(node_ctx.engine.stats().get("counters", {}).get("errors", 0)),
            }

        def run(models: list[str], n: int, seed: int) -> dict:
            before = counters()
            results, wall = asyncio.run(
                drive(node.url, key, models, zipf_weights(len(models), args.zipf), n, args.in_flight, seed)
            )
            after = counters()
            seen: set[str] = set()
            cold, warm, failed = [], [], [r for r in results if not r[2]]
            # results are in completion order; "cold" = the first request of its adapter to finish
            for model, ttft, ok, _ in results:
                if not ok:
                    continue
                (warm if model in seen else cold).append(ttft)
                seen.add(model)
            delta = {k: after[k] - before[k] for k in after}
            return {
                "adapters": len(models),
                "requests": n,
                "ok": n - len(failed),
                "errors": [r[3] for r in failed[:3]],
                "wall_s": wall,
                "req_per_s": n / wall,
                "distinct_adapters": len(seen),
                "ttft_cold_p50_ms": 1000 * _pct(cold, 0.5),
                "ttft_cold_p90_ms": 1000 * _pct(cold, 0.9),
                "ttft_warm_p50_ms": 1000 * _pct(warm, 0.5),
                "ttft_warm_p90_ms": 1000 * _pct(warm, 0.9),
                "n_cold": len(cold),
                "n_warm": len(warm),
                **delta,
                "downloads_per_1000_requests": 1000 * delta["downloads"] / n,
            }

        small = names[:8]
        asyncio.run(drive(node.url, key, [node_ctx.engine.model_name], [1.0], 32, args.in_flight, 0))  # warm-up
        rows = []
        rows.append(("8 adapters (before)", run(small, args.small_requests, seed=1)))
        rows.append((f"{args.adapters} adapters", run(names, args.requests, seed=2)))
        rows.append(("8 adapters (after)", run(small, args.small_requests, seed=3)))
        sampling.set()
        sampler.join(5)
        host_budget = args.max_cpu_loras * max(1, _host_bytes_per_adapter(node_ctx))
        summary = {
            "adapter_bytes_each": per_adapter,
            "store_setup_s": t_store,
            "register_s": t_register,
            "register_per_adapter_ms": 1000 * t_register / args.adapters,
            "host_peak_bytes": peaks["host_bytes"],
            "host_budget_bytes": host_budget,
            "disk_peak_bytes": peaks["disk_bytes"],
            "disk_budget_bytes": disk_budget,
        }
        _print(rows, summary, args)
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / "adapter_scale.json"
        out.write_text(json.dumps({"args": vars(args), "summary": summary, "rows": dict(rows)}, indent=2))
        print(f"\nJSON: {out}")
    finally:
        for s in reversed(servers):
            s.stop()
        moto.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _host_bytes_per_adapter(ctx) -> int:
    lora = ctx.engine.stats().get("lora", {})
    cached = lora.get("cpu_cached") or []
    return int(lora.get("cpu_cached_bytes", 0)) // max(1, len(cached))


def _print(rows, summary, args) -> None:
    print(
        f"\nadapter_scale: Zipf({args.zipf}), {args.in_flight} in flight, max_loras={args.max_loras}, "
        f"max_cpu_loras={args.max_cpu_loras}, disk budget {summary['disk_budget_bytes']} B"
    )
    cols = [
        ("run", None),
        ("req/s", "req_per_s"),
        ("distinct", "distinct_adapters"),
        ("TTFT cold p50/p90 ms", ("ttft_cold_p50_ms", "ttft_cold_p90_ms")),
        ("TTFT warm p50/p90 ms", ("ttft_warm_p50_ms", "ttft_warm_p90_ms")),
        ("slot hit/load", ("slot_hits", "slot_loads")),
        ("host hit/disk", ("cpu_hits", "disk_loads")),
        ("prefetch ready/wait", ("prefetch_ready", "prefetch_waits")),
        ("disk-cache hit", "disk_cache_hits"),
        ("downloads", "downloads"),
        ("dl/1k req", "downloads_per_1000_requests"),
        ("disk evict", "disk_evictions"),
        ("engine errors", "engine_errors"),
        ("ok", "ok"),
    ]
    print(" | ".join(c for c, _ in cols))
    for name, r in rows:
        cells = [name]
        for _, k in cols[1:]:
            if isinstance(k, tuple):
                cells.append("/".join(f"{r[x]:.0f}" for x in k))
            else:
                v = r[k]
                cells.append(f"{v:.2f}" if isinstance(v, float) else str(v))
        print(" | ".join(cells))
    small = statistics.median([rows[0][1]["req_per_s"], rows[2][1]["req_per_s"]])
    for name, r in rows:
        if r["errors"]:
            print(f"{name}: errors (first 3): {r['errors']}")
    print(f"\nthroughput {rows[1][0]} / 8 adapters (median of before/after): {rows[1][1]['req_per_s'] / small:.2f}x")
    for k, v in summary.items():
        print(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}")


if __name__ == "__main__":
    main()
