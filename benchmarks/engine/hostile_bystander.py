"""A bystander's latency while another tenant sends the worst body each request bound allows
(issue 32 item 3), through the real AsyncEngine on the SmolLM2-135M demo checkpoint.

    python -m benchmarks.engine.hostile_bystander [--rounds 3] [--streams 6]

Tenant "b" (the bystander) streams 16-token greedy answers one after another and records TTFT and
whole-stream time. Meanwhile tenant "a" keeps ``--attackers`` requests in flight of one shape:

  alone          nobody else: the bystander's floor
  plain          a: n=16, 64 tokens, no hostile field: the control (the same batch load)
  stop           plain + the most stop strings allowed (16 x 64 = 1,024 characters, never matched)
  logit_bias     plain + the most logit_bias entries allowed (300, spread over the vocabulary)
  schemas        a: distinct JSON schemas of the largest size allowed (128 KiB), compiled the way the
                 server does (worker thread, tenant's compile share), then 16 tokens under them
  stop_unbounded plain + 20,000 stop strings (the bound lifted): what the bound prevents

Configs alternate within each round (one process, the same engine), so machine load falls on all
of them alike. The ratio is the bystander's median against ``plain`` (target: <= 1.5). Writes
benchmarks/results/hostile_bystander.json and prints a markdown table with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time

from benchmarks.lib.paths import BENCH_MODELS, RESULTS
from loraplex.engine import EngineConfig, SamplingParams
from loraplex.engine.async_engine import AsyncEngine
from loraplex.engine.config import RequestLimits
from loraplex.engine.errors import BusyError, InvalidRequestError
from loraplex.engine.outputs import OutputKind
from loraplex.engine.request import EngineRequest
from loraplex.engine.sampling_params import StructuredOutputSpec

MODEL_DIR = BENCH_MODELS / "SmolLM2-135M-Instruct"
CONFIGS = ("alone", "plain", "stop", "logit_bias", "schemas", "stop_unbounded")
LIMITS = RequestLimits()


def _schema(i: int, limit: int) -> StructuredOutputSpec:
    """A distinct object schema just under ``limit`` characters (many small enum properties),
    built in one pass (the attacker's own CPU; run it off the event loop)."""

    def prop(j: int) -> dict:
        return {"type": "string", "enum": [f"v{i}_{j}_{k}" for k in range(6)]}

    one = len(json.dumps({f"f{i}_0": prop(0)}, separators=(",", ":"))) + 2
    props = {f"f{i}_{j}": prop(j) for j in range(limit // one)}
    spec = StructuredOutputSpec.json_schema({"type": "object", "properties": props})
    while len(spec.value) > limit:
        props.popitem()
        spec = StructuredOutputSpec.json_schema({"type": "object", "properties": props})
    return spec


def attack_params(kind: str, vocab: int, i: int) -> SamplingParams:
    rng = random.Random(i)
    plain = dict(n=16, max_tokens=64, temperature=1.0, seed=i, ignore_eos=True)
    if kind == "plain":
        return SamplingParams(**plain)
    if kind == "stop":
        per = LIMITS.max_stop_chars // LIMITS.max_stop_strings
        stops = [
            "".join(rng.choice("etaoin ") for _ in range(per - 1)) + "\x07" for _ in range(LIMITS.max_stop_strings)
        ]
        return SamplingParams(**plain, stop=stops)
    if kind == "stop_unbounded":
        return SamplingParams(**plain, stop=[f"\x07{k}" for k in range(20_000)])
    if kind == "logit_bias":
        ids = rng.sample(range(vocab), LIMITS.max_logit_bias)
        return SamplingParams(**plain, logit_bias={t: rng.uniform(-5, 5) for t in ids})
    raise ValueError(kind)


async def attacker(engine: AsyncEngine, kind: str, stop: asyncio.Event, counts: dict[str, int], base: int) -> None:
    vocab = engine.engine.model_config.vocab_size
    i = base
    while not stop.is_set():
        i += 1000
        try:
            if kind == "schemas":
                spec = await asyncio.to_thread(_schema, i, LIMITS.max_structured_spec_bytes - 64)
                # as the server does: compiled in a worker thread under the tenant's share, then submitted
                await asyncio.to_thread(engine.engine.structured.compile, spec, "a")
                params = SamplingParams(max_tokens=16, temperature=1.0, seed=i, structured_output=spec)
            else:
                params = attack_params(kind, vocab, i)
            req = EngineRequest(
                "Write a long story about a dragon.", params, tenant_id="a", output_kind=OutputKind.DELTA
            )
            async for _ in engine.submit(req):
                pass
            counts["done"] += 1
        except (BusyError, InvalidRequestError) as exc:
            counts["refused"] += 1
            counts.setdefault("why", str(exc)[:80])  # type: ignore[arg-type]
            await asyncio.sleep(0.2)


async def bystander(engine: AsyncEngine, n: int) -> list[tuple[float, float]]:
    out = []
    for k in range(n):
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        req = EngineRequest(f"Say hello number {k}.", params, tenant_id="b", output_kind=OutputKind.DELTA)
        t0 = time.perf_counter()
        ttft = None
        async for o in engine.submit(req):
            if ttft is None and any(c.token_ids for c in o.outputs):
                ttft = time.perf_counter() - t0
        out.append((ttft if ttft is not None else float("nan"), time.perf_counter() - t0))
    return out


async def phase(engine: AsyncEngine, kind: str, streams: int, attackers: int) -> dict:
    stop = asyncio.Event()
    counts = {"done": 0, "refused": 0}
    tasks = (
        []
        if kind == "alone"
        else [asyncio.create_task(attacker(engine, kind, stop, counts, k)) for k in range(attackers)]
    )
    if tasks:
        await asyncio.sleep(2.0)  # the attack is under way before the bystander starts
    samples = await bystander(engine, streams)
    stop.set()
    await asyncio.gather(*tasks)
    return {"samples": samples, **counts}


async def main_async(args: argparse.Namespace) -> dict:
    from loraplex.engine.real_model import ensure_demo_checkpoint

    model = ensure_demo_checkpoint(MODEL_DIR)
    cfg = EngineConfig(model=str(model), max_num_seqs=40, kv_cache_memory_gb=0.5)
    engine = AsyncEngine(cfg)
    engine.start()
    try:
        await phase(engine, "plain", 2, 1)  # warm-up: kernels, allocator, the grammar compiler
        await asyncio.to_thread(engine.engine.structured.compile, StructuredOutputSpec("json_object"), "warm")
        results: dict[str, dict] = {c: {"ttft": [], "total": [], "done": 0, "refused": 0} for c in CONFIGS}
        for r in range(args.rounds):
            order = list(CONFIGS)
            random.Random(r).shuffle(order)
            for kind in order:
                if kind == "stop_unbounded":  # the bound lifted for this phase only
                    engine.engine.limits = RequestLimits(max_stop_strings=10**6, max_stop_chars=10**8)
                res = await phase(engine, kind, args.streams, args.attackers)
                engine.engine.limits = cfg.request_limits
                results[kind]["ttft"] += [s[0] for s in res["samples"]]
                results[kind]["total"] += [s[1] for s in res["samples"]]
                results[kind]["done"] += res["done"]
                results[kind]["refused"] += res["refused"]
                if "why" in res:
                    results[kind]["why"] = res["why"]
                print(f"round {r} {kind}: total p50 {statistics.median(s[1] for s in res['samples']):.2f}s", flush=True)
        return results
    finally:
        engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=6)
    ap.add_argument("--attackers", type=int, default=2)
    args = ap.parse_args()
    load_before = os.getloadavg()
    results = asyncio.run(main_async(args))
    load_after = os.getloadavg()
    base = results["plain"]
    rows = []
    for kind in CONFIGS:
        r = results[kind]
        ttft, total = statistics.median(r["ttft"]), statistics.median(r["total"])
        rows.append(
            {
                "config": kind,
                "ttft_p50_s": round(ttft, 3),
                "stream_p50_s": round(total, 3),
                "stream_max_s": round(max(r["total"]), 3),
                "ttft_ratio_vs_plain": round(ttft / statistics.median(base["ttft"]), 2),
                "stream_ratio_vs_plain": round(total / statistics.median(base["total"]), 2),
                "attacker_done": r["done"],
                "attacker_refused": r["refused"],
                **({"refusal": r["why"]} if "why" in r else {}),
            }
        )
    meta = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "args": vars(args),
        "python": sys.version.split()[0],
    }
    out = RESULTS / "hostile_bystander.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nload average before {load_before}, after {load_after}")
    print(
        "| config | TTFT p50 s | stream p50 s | stream max s | TTFT / plain | stream / plain | attacker done / refused |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['config']} | {r['ttft_p50_s']} | {r['stream_p50_s']} | {r['stream_max_s']} | "
            f"{r['ttft_ratio_vs_plain']} | {r['stream_ratio_vs_plain']} | {r['attacker_done']} / {r['attacker_refused']} |"
        )


if __name__ == "__main__":
    main()
