"""Scale-out on Ray Serve: adapter-affinity routing vs no affinity, and 1 vs 2 engine replicas;
with ``--scenario``: multi-turn sessions per routing mode, a two-tenant flood (global fairness on
and off), autoscaling (``scenarios.py``), control-plane kill and SIGTERM drain
(``faults.py``).

Each configuration is a real ``loraplex serve`` (``--replicas 1`` = the plain process; 2 = Ray
Serve) on the demo model with 32 PEFT adapters and a small ``max_loras``, driven over HTTP by a
closed loop of streaming completions whose adapter follows a power-law (Zipf) popularity.

Reported per configuration: requests/s and output tokens/s, client-side TTFT p50/p99, and the
engine's own adapter counters summed over replicas, per 1,000 requests: disk loads (adapter read
from the store), device slot loads and slot evictions. Warm-up requests are not counted.

    .venv/bin/python -m benchmarks.scale_out.bench                # all configurations
    .venv/bin/python -m benchmarks.scale_out.bench --requests 200 --configs affinity-2
    .venv/bin/python -m benchmarks.scale_out.bench --scenario sessions,flood,faults,autoscale
    .venv/bin/python -m benchmarks.scale_out.bench --scenario faults   # control kill, rolling restart, drain
    .venv/bin/python -m benchmarks.scale_out.bench --scenario kill --kill-rounds 3   # the control kill alone
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import tempfile
import time
import zipfile
from pathlib import Path

import httpx

from benchmarks.lib.paths import RESULTS
from tests.harness.ray import ServeCluster

ADMIN_KEY = "lpx-admin-benchmark-key-0123456789"
H = {"Authorization": f"Bearer {ADMIN_KEY}"}
CONFIGS = {  # name: (replicas, routing)
    "single-1": (1, "affinity"),
    "affinity-2": (2, "affinity"),
    "load-2": (2, "load"),
}
COUNTERS = ("disk_loads", "slot_loads", "slot_evictions", "cpu_evictions")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def build_adapters(model: Path, out: Path, n: int) -> list[bytes]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    archives = []
    base = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    for i in range(n):
        torch.manual_seed(i + 1)
        cfg = LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM"
        )
        peft_model = get_peft_model(base, cfg)
        peft_model.save_pretrained(str(out / f"a{i}"), safe_serialization=True)
        base = peft_model.unload()  # the base model back, without this adapter's layers
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for f in sorted((out / f"a{i}").iterdir()):
                zf.writestr(f.name, f.read_bytes())
        archives.append(buf.getvalue())
    return archives


def Server(root: Path, model: Path, replicas: int, routing: str, args, extra: str = "") -> ServeCluster:
    """A real ``loraplex serve`` through the tests' harness (own ports, temp dir, process group):
    ``--replicas 1`` is the plain process, 2 and more Ray Serve."""
    config = f"""
[engine]
kv_cache_memory_gb = 0.1
max_num_seqs = {getattr(args, "max_num_seqs", 32)}
max_loras = {args.max_loras}
max_cpu_loras = {args.max_cpu_loras}
max_lora_rank = 16
fair_share_preemption = {getattr(args, "fair_share_preemption", "true")}
[cluster]
replicas = {replicas}
routing = "{routing}"
replica_num_cpus = 0.5
ingress_num_cpus = 0.25
{extra}
"""
    return ServeCluster(root, model, config, replicas=replicas, admin_key=ADMIN_KEY, start_timeout=600)


def counters(server: ServeCluster) -> dict[str, int]:
    eng = httpx.get(server.url + "/admin/v1/engine", headers=H, timeout=30).json()
    reps = eng.get("replicas") or [eng]
    return {c: sum(int(r["lora"].get(c, 0)) for r in reps) for c in COUNTERS}


def zipf_choices(n_adapters: int, n: int, s: float, seed: int) -> list[int]:
    weights = [1 / (i + 1) ** s for i in range(n_adapters)]
    return random.Random(seed).choices(range(n_adapters), weights=weights, k=n)


async def drive(url: str, key: str, models: list[str], order: list[int], concurrency: int, max_tokens: int) -> dict:
    ttft: list[float] = []
    tokens = [0]
    replicas: dict[str, int] = {}
    queue = list(order)
    errors = [0]

    async def worker(c: httpx.AsyncClient) -> None:
        while queue:
            i = queue.pop()
            body = {
                "model": models[i],
                "prompt": f"Request about topic {i}",
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            t0 = time.perf_counter()
            first = None
            async with c.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    errors[0] += 1
                    await r.aread()
                    continue
                rep = r.headers.get("x-loraplex-replica", "?")
                replicas[rep] = replicas.get(rep, 0) + 1
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    ev = json.loads(line[6:])
                    if first is None and ev.get("choices") and ev["choices"][0].get("text"):
                        first = time.perf_counter() - t0
                    if ev.get("usage"):
                        tokens[0] += ev["usage"]["completion_tokens"]
            if first is not None:
                ttft.append(first)

    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300) as c:
        await asyncio.gather(*[worker(c) for _ in range(concurrency)])
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "requests": len(order),
        "errors": errors[0],
        "out_tokens": tokens[0],
        "req_per_s": len(order) / wall,
        "tok_per_s": tokens[0] / wall,
        "ttft_p50_ms": _pct(ttft, 0.5) * 1000,
        "ttft_p99_ms": _pct(ttft, 0.99) * 1000,
        "per_replica_requests": replicas,
    }


def run_config(name: str, model: Path, archives: list[bytes], args) -> dict:
    replicas, routing = CONFIGS[name]
    root = Path(tempfile.mkdtemp(prefix=f"lpx-scale-{name}-"))
    server = Server(root, model, replicas, routing, args)
    try:
        with httpx.Client(base_url=server.url, headers=H, timeout=60) as c:
            tid = c.post("/admin/v1/tenants", json={"name": "bench"}).json()["id"]
            key = c.post(f"/admin/v1/tenants/{tid}/keys", json={}).json()["key"]
            models = []
            for i, data in enumerate(archives):
                r = c.post(
                    "/admin/v1/adapters", data={"name": f"a{i}", "tenant_id": tid}, files={"file": (f"a{i}.zip", data)}
                )
                r.raise_for_status()
                models.append(f"a{i}")
        warm = zipf_choices(len(models), args.warmup, args.zipf, seed=1)
        asyncio.run(drive(server.url, key, models, warm, args.concurrency, args.max_tokens))
        time.sleep(2.0)  # Serve's routers learn which replica holds what
        before = counters(server)
        order = zipf_choices(len(models), args.requests, args.zipf, seed=2)
        res = asyncio.run(drive(server.url, key, models, order, args.concurrency, args.max_tokens))
        after = counters(server)
        per_k = 1000 / args.requests
        res.update({f"{c}_per_1k": (after[c] - before[c]) * per_k for c in COUNTERS})
        res.update({"config": name, "replicas": replicas, "routing": routing})
        return res
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--scenario", default="routing", help="routing, or any of sessions,flood,faults,kill,replica-kill,autoscale"
    )
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--flood-seconds", type=float, default=60.0)
    ap.add_argument("--flood-streams", type=int, default=24, help="flooder streams (both replicas)")
    ap.add_argument("--flood-tokens", type=int, default=24, help="max_tokens of each flood request")
    ap.add_argument("--flood-max-num-seqs", type=int, default=8, help="engine max_num_seqs in the flood")
    ap.add_argument("--fault-clients", type=int, default=8, help="closed-loop streams in the faults scenario")
    ap.add_argument("--fault-tokens", type=int, default=64, help="max_tokens of each faults-scenario stream")
    ap.add_argument("--kill-rounds", type=int, default=3, help="kills in the kill and replica-kill scenarios")
    ap.add_argument("--kill-streams", type=int, default=16, help="concurrent streams in the replica-kill scenario")
    ap.add_argument("--fault-cap-s", type=float, default=180.0, help="bound on the control-kill wait (rollout: 3x)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--adapters", type=int, default=32)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-loras", type=int, default=4)
    ap.add_argument("--max-cpu-loras", type=int, default=8)
    ap.add_argument("--zipf", type=float, default=1.1)
    args = ap.parse_args()
    from loraplex.engine.demo_model import ensure_demo_model

    work = Path(tempfile.mkdtemp(prefix="lpx-scale-out-"))
    model = Path(ensure_demo_model(work / "demo"))
    if args.scenario != "routing":
        from benchmarks.scale_out.runs import run_scenarios

        archives = build_adapters(model, work / "adapters", min(args.adapters, 4))
        run_scenarios(args, model, archives, Server)
        return
    archives = build_adapters(model, work / "adapters", args.adapters)
    rows = [run_config(name, model, archives, args) for name in args.configs.split(",")]
    head = (
        f"{'config':<11} {'req/s':>6} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'disk/1k':>8} {'slot/1k':>8} {'evict/1k':>8}  per replica"
    )
    print(
        f"\n{args.adapters} adapters, Zipf s={args.zipf}, max_loras={args.max_loras}, "
        f"max_cpu_loras={args.max_cpu_loras}, {args.requests} requests (+{args.warmup} warm-up), "
        f"concurrency {args.concurrency}, {args.max_tokens} tokens each, {os.cpu_count()} CPU cores"
    )
    print(head)
    for r in rows:
        print(
            f"{r['config']:<11} {r['req_per_s']:6.1f} {r['tok_per_s']:7.0f} {r['ttft_p50_ms']:7.0f}ms "
            f"{r['ttft_p99_ms']:7.0f}ms {r['disk_loads_per_1k']:8.0f} {r['slot_loads_per_1k']:8.0f} "
            f"{r['slot_evictions_per_1k']:8.0f}  {sorted(r['per_replica_requests'].values())}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "scale_out.json"
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
