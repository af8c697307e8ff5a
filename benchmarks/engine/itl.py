"""Do running decodes keep their pace while new prompts arrive? Inter-token latency in-process.

The shape of ``vllm bench serve`` at a fixed concurrency, without HTTP: C requests in flight
(random prompts of ``--prompt`` tokens, ``--tokens`` output tokens, ignore_eos); each finished
request is replaced at once, so prompts keep arriving while the others decode. The engine steps in
this process; after every step each request that got a token records the time. ITL = the gap
between two consecutive tokens of one request (the first token excluded: that is TTFT).

Configurations: ``max_prefill_tokens_with_decodes`` = None (a step takes as many prompt tokens
as ``max_num_batched_tokens`` allows, the old behaviour) and a few caps, in alternating rounds in
one process (one engine per configuration, built once). Reported medians over rounds of: ITL p50 /
p99 in wall ms and in process-CPU ms (the CPU time the process spent between the two tokens:
steadier than wall time when other work shares the machine), TTFT p50, output tok/s (wall and
per CPU-second).

    .venv/bin/python -m benchmarks.engine.itl                         # bench preset, c16, ~4 rounds
    .venv/bin/python -m benchmarks.engine.itl --quick
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.lib.workload import pct, print_table, write_json
from loraplex.engine import EngineRequest, LLMEngine, SamplingParams, runtime_env
from loraplex.engine.config import EngineConfig
from loraplex.engine.demo_model import create_random_checkpoint


def run_once(engine: LLMEngine, prompts: list[list[int]], concurrency: int, tokens: int) -> dict:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    pending = list(prompts)
    seen: dict[str, tuple[int, float, float]] = {}  # request id -> (tokens so far, wall, cpu) of the last token
    start: dict[str, tuple[float, float]] = {}
    itl_wall: list[float] = []
    itl_cpu: list[float] = []
    ttft: list[float] = []
    out_tokens = 0
    steps: list[tuple[int, int, float]] = []  # per step: (prompt tokens, decode rows, wall seconds)

    def submit() -> None:
        req = engine.add_request(EngineRequest(pending.pop(), params))
        start[req.request_id] = (time.perf_counter(), time.process_time())

    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(min(concurrency, len(pending))):
        submit()
    schedule = engine.scheduler.schedule
    plans: list = []

    def logged_schedule():  # records each step's shape (prompt tokens vs decode rows) at plan time
        plan = schedule()
        dec = [c.num_tokens for c in plan.chunks if c.seq.in_decode]
        plans.append((plan.num_tokens - sum(dec), len(dec)))
        return plan

    engine.scheduler.schedule = logged_schedule  # type: ignore[method-assign]
    while engine.has_unfinished_requests():
        t_step = time.perf_counter()
        outputs = engine.step()
        wall, cpu = time.perf_counter(), time.process_time()
        if plans and sum(plans[-1]):
            steps.append((*plans[-1], wall - t_step))
        plans.clear()
        for out in outputs:
            n = len(out.outputs[0].token_ids)
            prev = seen.get(out.request_id)
            if prev is None and n:
                ttft.append(wall - start[out.request_id][0])
            elif prev is not None and n > prev[0]:
                gaps = n - prev[0]  # more than one token in a step: spread the gap over them
                itl_wall.extend([(wall - prev[1]) / gaps] * gaps)
                itl_cpu.extend([(cpu - prev[2]) / gaps] * gaps)
            if n:
                seen[out.request_id] = (n, wall, cpu)
            if out.finished:
                out_tokens += n
                if pending:
                    submit()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    del engine.scheduler.schedule
    mixed = [s for p, d, s in steps if p and d]
    pure = [s for p, d, s in steps if not p and d]
    return {
        "steps": len(steps),
        "gaps": len(itl_wall),
        "decode_step_p50_ms": 1e3 * pct(pure, 0.5) if pure else float("nan"),
        "mixed_steps": len(mixed),
        "mixed_step_p50_ms": 1e3 * pct(mixed, 0.5) if mixed else float("nan"),
        "max_prompt_tok_with_decodes": max((p for p, d, _ in steps if d), default=0),
        "itl_p50_ms": 1e3 * pct(itl_wall, 0.5),
        "itl_p99_ms": 1e3 * pct(itl_wall, 0.99),
        "itl_cpu_p50_ms": 1e3 * pct(itl_cpu, 0.5),
        "itl_cpu_p99_ms": 1e3 * pct(itl_cpu, 0.99),
        "ttft_p50_ms": 1e3 * pct(ttft, 0.5),
        "tok/s": out_tokens / wall,
        "tok/cpu-s": out_tokens / cpu,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--preset", default="bench")
    ap.add_argument(
        "--model",
        default=None,
        help="a checkpoint directory, or 'demo' (SmolLM2-135M-Instruct, what the peer bench serves); default: a random model of --preset",
    )
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--caps", default="none,32,64,128", help="max_prefill_tokens_with_decodes values")
    ap.add_argument(
        "--configs",
        default=None,
        help="BUDGET:CAP,... pairs of max_num_batched_tokens and max_prefill_tokens_with_decodes"
        " (cap 'none'); replaces --caps, e.g. 512:none,2048:128",
    )
    ap.add_argument("--dtype", default="auto", help="auto: what a server picks (bf16 only on a CPU with native bf16)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.quick:
        args.preset, args.requests, args.rounds, args.concurrency = "demo", 16, 2, 8
    pairs = args.configs.split(",") if args.configs else [f"512:{c}" for c in args.caps.split(",")]
    caps = [(int(b), None if c == "none" else int(c)) for b, c in (p.split(":") for p in pairs)]
    runtime_env.reexec("benchmarks/engine/itl.py")  # the fast runtime, as a served engine runs
    if args.model == "demo":
        from benchmarks.lib.real_text import demo_model_dir

        args.model = str(demo_model_dir())
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(create_random_checkpoint(Path(tmp) / "m", preset=args.preset, seed=3))
        engines = {
            cap: LLMEngine(
                EngineConfig(
                    model=model,
                    dtype=args.dtype,
                    max_num_seqs=max(64, args.concurrency),
                    max_num_batched_tokens=cap[0],
                    max_prefill_tokens_with_decodes=cap[1],
                    scheduling_policy="fcfs",
                    kv_cache_memory_gb=0.5,
                )
            )
            for cap in caps
        }
        vocab = min(engines[caps[0]].model_config.vocab_size, 50000)

        def fresh_prompts(seed: int, n: int) -> list[list[int]]:
            # New prompts for every round (and the warm-up): a prompt an engine has seen would hit
            # its prefix cache, and its prefill, the thing measured here, would cost nothing.
            rng = random.Random(seed)
            return [[rng.randrange(10, vocab) for _ in range(args.prompt)] for _ in range(n)]

        for engine in engines.values():  # warm-up: build the native kernels, touch the weights
            run_once(engine, fresh_prompts(10_000, 2), 2, 2)
        runs: dict = {cap: [] for cap in caps}
        for r in range(args.rounds):
            order = caps if r % 2 == 0 else caps[::-1]
            prompts = fresh_prompts(r, args.requests)  # the same for every configuration of the round
            for cap in order:
                runs[cap].append(run_once(engines[cap], prompts, args.concurrency, args.tokens))
                print(f"round {r} cap={cap}: {runs[cap][-1]}", flush=True)
    rows = []
    base = statistics.median(x["itl_cpu_p99_ms"] for x in runs[caps[0]])
    for cap in caps:
        row: dict = {"budget": cap[0], "cap with decodes": "none" if cap[1] is None else cap[1]}
        for key in runs[cap][0]:
            row[key] = statistics.median(x[key] for x in runs[cap])
        row["cpu p99 vs first"] = row["itl_cpu_p99_ms"] / base
        rows.append(row)
    print_table(rows, list(rows[0]))
    path = write_json("itl", {"args": vars(args), "rows": rows, "runs": {f"{b}:{c}": v for (b, c), v in runs.items()}})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
