"""Fairness benchmark: the VTC paper's synthetic workloads (Sheng et al., OSDI'24), scaled to this CPU,
replayed in real time through the real engine under fcfs, priority and fair.

    python -m benchmarks.engine.fairness [--seconds 15] [--preset demo|bench] [--workloads overload,weighted]

Workloads (rates are multiples of the engine's measured capacity C, in requests/s):
  overload    2 tenants, A at 2C and B at 1C: both alone above capacity
  short_long  A: long prompts, short outputs; B: short prompts, long outputs; both above capacity
  weighted    4 tenants with weights 1:2:3:4, each above capacity
  on_off      A steady above capacity; B alternates on/off every quarter of the run

Clock: this process's CPU time with torch on one thread, so other work on a shared machine does not
distort arrivals, TTFT or throughput (arrivals are replayed against it; aging reads it too).

Per policy: accumulated service difference (weight-normalised, summed only over steps where both tenants
are backlogged; max and final, worst pair), windowed Jain's index over weight-normalised service of the
tenants backlogged through a window, per-tenant TTFT p50/p99, total throughput (tokens/s). Service is
w_p·prompt + w_q·output tokens (1 and 2). Writes benchmarks/results/fairness.json and one PNG per
workload (service over time per tenant and policy).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.lib.paths import RESULTS
from loraplex.engine import SamplingParams
from loraplex.engine.config import EngineConfig
from loraplex.engine.demo_model import create_random_checkpoint
from loraplex.engine.llm_engine import LLMEngine

clock = time.process_time
W_P, W_Q = 1.0, 2.0
POLICIES = ("fcfs", "priority", "fair")
ENGINE_ARGS = dict(
    max_num_seqs=16,
    max_num_batched_tokens=256,
    block_size=16,
    num_kv_blocks=160,
    kernel_backend="torch",
    dtype="float32",
)


@dataclass
class Arrival:
    t: float
    tenant: str
    prompt_len: int
    max_tokens: int


@dataclass
class Workload:
    name: str
    arrivals: list[Arrival]
    weights: dict[str, float]


def poisson(tenant, rate, t0, t1, prompt, output, rng) -> list[Arrival]:
    out, t = [], t0
    while True:
        t += rng.expovariate(rate)
        if t >= t1:
            return out
        out.append(Arrival(t, tenant, rng.randint(*prompt), rng.randint(*output)))


def workloads(capacity: float, seconds: float, seed: int = 0) -> list[Workload]:
    rng = random.Random(seed)
    mid = dict(prompt=(48, 80), output=(48, 80))
    on_off = poisson("A", 1.5 * capacity, 0, seconds, rng=rng, **mid)
    quarter = seconds / 4
    for k in (0, 2):  # B is on during the 1st and 3rd quarters
        on_off += poisson("B", 1.5 * capacity, k * quarter, (k + 1) * quarter, rng=rng, **mid)
    return [
        Workload(
            "overload",
            poisson("A", 2 * capacity, 0, seconds, rng=rng, **mid) + poisson("B", capacity, 0, seconds, rng=rng, **mid),
            {"A": 1.0, "B": 1.0},
        ),
        Workload(
            "short_long",
            poisson("A", 1.5 * capacity, 0, seconds, (160, 200), (8, 16), rng)
            + poisson("B", 1.5 * capacity, 0, seconds, (8, 16), (100, 140), rng),
            {"A": 1.0, "B": 1.0},
        ),
        Workload(
            "weighted",
            [a for i, t in enumerate("ABCD") for a in poisson(t, capacity, 0, seconds, rng=rng, **mid)],
            {"A": 1.0, "B": 2.0, "C": 3.0, "D": 4.0},
        ),
        Workload("on_off", on_off, {"A": 1.0, "B": 1.0}),
    ]


def make_engine(model: str, policy: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, scheduling_policy=policy, **ENGINE_ARGS))


def measure_capacity(model: str, seconds: float = 6.0) -> float:
    """Requests/s the engine completes when saturated with 'mid' requests."""
    engine = make_engine(model, "fcfs")
    rng = random.Random(1)
    vocab = engine.model_config.vocab_size
    for _ in range(400):
        engine.add_request(
            [rng.randrange(5, vocab) for _ in range(64)],
            SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True),
        )
    for _ in range(20):  # warm up
        engine.step()
    start, done = clock(), 0
    while clock() - start < seconds:
        done += sum(1 for o in engine.step() if o.finished)
    return done / (clock() - start)


def replay(model: str, policy: str, wl: Workload, seconds: float) -> dict:
    engine = make_engine(model, policy)
    engine.scheduler.clock = clock
    # Under `priority`, A is the better class (the run shows what strict classes do to the others);
    # under fcfs and fair all tenants share one class.
    for tenant, weight in wl.weights.items():
        engine.set_tenant(tenant, priority=0 if policy == "priority" and tenant == "A" else 1, weight=weight)
    rng = random.Random(2)
    vocab = engine.model_config.vocab_size
    arrivals = sorted(wl.arrivals, key=lambda a: a.t)
    reqs, nxt, timeline, arrived, ttft_of = [], 0, [], {}, {}
    book = engine.policy.book
    t0 = clock()
    while True:
        now = clock() - t0
        if now >= seconds:
            break
        while nxt < len(arrivals) and arrivals[nxt].t <= now:
            a = arrivals[nxt]
            nxt += 1
            req = engine.add_request(
                [rng.randrange(5, vocab) for _ in range(a.prompt_len)],
                SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True),
                tenant_id=a.tenant,
                arrival_time=t0 + a.t,
            )
            reqs.append(req)
            arrived[req.request_id] = a.t
        if not engine.scheduler.has_work():
            # idle: jump the CPU clock's replay ahead (sleeping burns no CPU time)
            t0 -= max(0.0, (arrivals[nxt].t if nxt < len(arrivals) else seconds) - now)
            continue
        outs = engine.step()
        now = clock() - t0
        for o in outs:
            if o.request_id not in ttft_of and any(c.token_ids for c in o.outputs):
                ttft_of[o.request_id] = now - arrived[o.request_id]
        timeline.append(
            (
                now,
                {t: W_P * book.prompt_tokens[t] + W_Q * book.output_tokens[t] for t in wl.weights},
                {t: book.num_waiting.get(t, 0) > 0 for t in wl.weights},
            )
        )
    tokens = sum(book.prompt_tokens.values()) + sum(book.output_tokens.values())
    ttft = {
        t: sorted(ttft_of[r.request_id] for r in reqs if r.tenant_id == t and r.request_id in ttft_of)
        for t in wl.weights
    }
    return {
        "timeline": timeline,
        "throughput_tok_s": tokens / seconds,
        "ttft": ttft,
        "served": {t: timeline[-1][1][t] if timeline else 0.0 for t in wl.weights},
        "requests": {t: sum(1 for r in reqs if r.tenant_id == t) for t in wl.weights},
    }


def service_difference(timeline, weights) -> tuple[float, float, list[tuple[float, float]]]:
    """Worst pair's accumulated |ΔW_i/w_i − ΔW_j/w_j| over steps where both are backlogged."""
    pairs = list(itertools.combinations(sorted(weights), 2))
    acc = dict.fromkeys(pairs, 0.0)
    series, worst, prev = [], 0.0, None
    for t, served, backlogged in timeline:
        if prev is not None:
            for i, j in pairs:
                if backlogged[i] and backlogged[j]:
                    acc[(i, j)] += (served[i] - prev[i]) / weights[i] - (served[j] - prev[j]) / weights[j]
        prev = served
        cur = max(abs(v) for v in acc.values())
        worst = max(worst, cur)
        series.append((t, cur))
    return worst, series[-1][1] if series else 0.0, series


def windowed_jain(timeline, weights, window: float) -> tuple[float | None, float | None]:
    """Mean and min Jain's index over windows, among tenants backlogged at every step of the window."""
    values, start = [], 0
    while start < len(timeline):
        end = start
        while end < len(timeline) and timeline[end][0] - timeline[start][0] < window:
            end += 1
        if end >= len(timeline):
            break
        steps = timeline[start : end + 1]
        tenants = [t for t in weights if all(b[t] for _, _, b in steps)]
        if len(tenants) >= 2:
            x = [(steps[-1][1][t] - steps[0][1][t]) / weights[t] for t in tenants]
            if sum(x) > 0:
                values.append(sum(x) ** 2 / (len(x) * sum(v * v for v in x)))
        start = end
    if not values:
        return None, None
    return statistics.mean(values), min(values)


def pct(xs, q):
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def plot(name: str, weights, runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.8), sharey=True)
    for ax, (policy, run) in zip(axes, runs.items()):
        ts = [t for t, _, _ in run["timeline"]]
        for tenant, w in weights.items():
            ax.plot(ts, [s[tenant] / w for _, s, _ in run["timeline"]], label=f"{tenant} (w={w:g})")
        ax.set_title(f"{name} — {policy}")
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("service / weight (w_p·in + w_q·out tokens)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--preset", default="demo", choices=("demo", "bench"))
    ap.add_argument("--workloads", default="overload,short_long,weighted,on_off")
    ap.add_argument("--jain-window", type=float, default=2.0)
    args = ap.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    model = tempfile.mkdtemp(prefix="loraplex-fair-")
    create_random_checkpoint(model, preset=args.preset, seed=0)
    capacity = measure_capacity(model)
    print(f"model preset={args.preset}  capacity ≈ {capacity:.1f} req/s (64 in / 64 out)  run={args.seconds:g}s")
    wanted = args.workloads.split(",")
    report = {
        "preset": args.preset,
        "seconds": args.seconds,
        "capacity_req_s": capacity,
        "engine": ENGINE_ARGS,
        "workloads": {},
    }
    header = (
        f"{'workload':<11} {'policy':<9} {'diff max':>9} {'diff end':>9} {'jain mean':>9} {'jain min':>8} "
        f"{'tok/s':>7}  TTFT p50/p99 per tenant (s)"
    )
    print(header)
    print("-" * len(header))
    for wl in workloads(capacity, args.seconds):
        if wl.name not in wanted:
            continue
        runs, rows = {}, {}
        for policy in POLICIES:
            run = replay(model, policy, wl, args.seconds)
            runs[policy] = run
            dmax, dend, series = service_difference(run["timeline"], wl.weights)
            jmean, jmin = windowed_jain(run["timeline"], wl.weights, args.jain_window)
            ttft = {t: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "n": len(v)} for t, v in run["ttft"].items()}
            rows[policy] = {
                "service_diff_max": dmax,
                "service_diff_final": dend,
                "jain_mean": jmean,
                "jain_min": jmin,
                "throughput_tok_s": run["throughput_tok_s"],
                "ttft": ttft,
                "served": run["served"],
                "requests": run["requests"],
                "service_diff_series": series[:: max(1, len(series) // 200)],
            }
            fmt = lambda x: "  n/a" if x is None else f"{x:.3f}"  # noqa: E731
            tt = " ".join(f"{t}:{fmt(v['p50'])}/{fmt(v['p99'])}" for t, v in ttft.items())
            print(
                f"{wl.name:<11} {policy:<9} {dmax:>9.0f} {dend:>9.0f} {fmt(jmean):>9} {fmt(jmin):>8} "
                f"{run['throughput_tok_s']:>7.0f}  {tt}",
                flush=True,
            )
        fcfs_tp = rows["fcfs"]["throughput_tok_s"]
        for r in rows.values():
            r["throughput_vs_fcfs"] = r["throughput_tok_s"] / fcfs_tp if fcfs_tp else None
        png = RESULTS / f"fairness_{wl.name}.png"
        plot(wl.name, wl.weights, runs, png)
        report["workloads"][wl.name] = {"weights": wl.weights, "plot": str(png), "policies": rows}
    out = RESULTS / "fairness.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out} and fairness_<workload>.png next to it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
