"""A bf16 model's engine steps on CPU: linear weights packed for oneDNN at load vs plain ``F.linear``.

    .venv/bin/python -m benchmarks.engine.bf16_step [--batches 16,64] [--threads 1] [--steps 6] [--rounds 3]
    .venv/bin/python -m benchmarks.engine.bf16_step --configs packed --rounds 1   # one engine only

``--configs`` with one name builds only that engine and prints one ``BF16_STEP {json}`` line per
batch size: an outside A/B runner can then alternate whole processes (one per configuration) and
pair their phase timings (``benchmarks/engine/bf16_ab.py`` reads two such logs).

One process, two ``LLM``s on the demo model (SmolLM2-135M-Instruct) in bf16 on the native CPU
backend, identical but for the linear layers (``kernels/cpu_packed.py``): ``plain`` is built with
``LORAPLEX_CPU_KIND=none`` (what a CPU without native bf16 runs: ``F.linear``, which reorders the
weight on every call), ``packed`` with this CPU's own kind. Per batch size and round, each engine
runs (alternately, the order reversed every other round):

  * prefill: ``batch`` prompts of ``--prompt`` tokens admitted at once, steps until every one has
    its first token (what TTFT at concurrency ``batch`` is made of);
  * decode: ``--steps`` pure decode steps of the same batch.

CPU ms of this process per phase (robust to other load on a shared machine) and wall ms; the ratio
is plain ÷ packed CPU time (> 1: packed is faster). Greedy tokens of both are compared. Prints the
CPU kind and the load; JSON: benchmarks/results/bf16_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

from benchmarks.lib.paths import RESULTS


def run_config(llm, batch: int, prompt: int, steps: int, rng: random.Random) -> tuple[dict, list[list[int]]]:
    from loraplex.engine import SamplingParams
    from loraplex.engine.request import EngineRequest

    engine = llm.engine
    sp = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(prompt)], sp))
    t0, c0 = time.perf_counter(), time.process_time()
    while any(not s.in_decode for s in engine.scheduler.running) or engine.policy.num_waiting():
        engine.step()
    pre_wall, pre_cpu = time.perf_counter() - t0, time.process_time() - c0
    engine.step()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        engine.step()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = [list(s.token_ids[prompt:]) for s in sorted(engine.scheduler.running, key=lambda s: s.seq_id)]
    for rid in list(engine.requests):
        engine.abort_request(rid)
    return {
        "prefill_cpu_ms": 1e3 * pre_cpu,
        "prefill_wall_ms": 1e3 * pre_wall,
        "decode_cpu_ms": 1e3 * cpu / steps,
        "decode_wall_ms": 1e3 * wall / steps,
    }, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default="plain,packed", help="plain, packed or both (the ratio needs both)")
    args = ap.parse_args()
    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM
    from loraplex.kernels import cpu_packed

    torch.set_num_threads(args.threads)
    kind = cpu_packed.cpu_kind()
    print(f"CPU: {kind.model} | kind {kind.name} | flags {' '.join(kind.flags)} | load {os.getloadavg()}")
    batches = [int(b) for b in args.batches.split(",")]
    llms = {}
    wanted = args.configs.split(",")
    for name, env in (("plain", "none"), ("packed", kind.name)):
        if name not in wanted:
            continue
        os.environ["LORAPLEX_CPU_KIND"] = env
        llms[name] = LLM(
            str(demo_model_dir()), dtype="bfloat16", kernel_backend="cpu", max_num_seqs=max(batches), seed=0
        )
    del os.environ["LORAPLEX_CPU_KIND"]
    for name, llm in llms.items():
        model = llm.engine.runner.model
        n = sum(p.packed is not None for ps in model.lora_projections().values() for p in ps)
        print(f"{name}: packed projections {n} (0: plain weights)")
    results: dict[str, list[dict]] = {}
    configs = [(b, c) for b in batches for c in llms]
    for r in range(args.rounds):
        for b, c in configs if r % 2 == 0 else configs[::-1]:
            res, tokens = run_config(llms[c], b, args.prompt, args.steps, random.Random(1000 * r + b))
            results.setdefault(f"b{b}-{c}", []).append(res | {"tokens": tokens})
            print(f"round {r} b{b} {c}: " + json.dumps({k: round(v, 1) for k, v in res.items()}), flush=True)
    if len(llms) == 1:
        (only,) = llms
        for b in batches:
            rows = results[f"b{b}-{only}"]
            med = {k: statistics.median(x[k] for x in rows) for k in rows[0] if k != "tokens"}
            line = {"config": only, "batch": b, "kind": kind.name, "load": os.getloadavg()[0], **med,
                    "tokens": rows[0]["tokens"]}  # fmt: skip
            print("BF16_STEP " + json.dumps(line), flush=True)
        return
    print(f"\nmedians of {args.rounds} rounds; {args.threads} thread(s); load now {os.getloadavg()}")
    print(
        f"{'batch':>5} {'config':>7} {'prefill CPU ms':>14} {'decode CPU ms/step':>18} {'prefill ratio':>13} {'decode ratio':>12} {'same tokens':>11}"
    )
    table = []
    for b in batches:
        med = {
            c: {
                k: statistics.median(x[k] for x in results[f"b{b}-{c}"])
                for k in results[f"b{b}-{c}"][0]
                if k != "tokens"
            }
            for c in llms
        }
        same = sum(a["tokens"] == p["tokens"] for a, p in zip(results[f"b{b}-plain"], results[f"b{b}-packed"]))
        for c in llms:
            m = med[c]
            pr = med["plain"]["prefill_cpu_ms"] / m["prefill_cpu_ms"]
            dr = med["plain"]["decode_cpu_ms"] / m["decode_cpu_ms"]
            print(
                f"{b:5d} {c:>7} {m['prefill_cpu_ms']:14.1f} {m['decode_cpu_ms']:18.1f} {pr:13.2f} {dr:12.2f} {f'{same}/{args.rounds}':>11}"
            )
            table.append({"batch": b, "config": c, **m, "prefill_ratio": pr, "decode_ratio": dr, "same_tokens": same})
    out = RESULTS / "bf16_step.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpu": kind.model, "kind": kind.name, "flags": list(kind.flags), "args": vars(args),
            "load_after": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    out.write_text(json.dumps({"meta": meta, "table": table}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
