"""Base-model decode step on CPU: float32 GEMMs (MKL) vs the packed bf16 copy of the weights.

    .venv/bin/python -m benchmarks.engine.decode_step [--batches 16,64] [--threads 1,2] [--steps 6] [--rounds 3]

One process, one ``LLM`` on the demo model (SmolLM2-135M-Instruct: a bf16 checkpoint, served in
float32 where the CPU has no native bf16, so its weights are bf16-exact and the native kernels pack
them; ``kernels/csrc/cpu_linear.cpp``). Configurations, alternated every round (order reversed
every other round), each over ``--steps`` pure decode steps after 16-token prefills:

  * ``fp32 GEMM``: the packed copies taken away, every linear and the head run ``F.linear`` (MKL)
  * ``packed bf16``: what the engine does by default

for every batch size and torch thread count. Reported per step, medians over rounds: CPU ms
(process time: robust to other load on a shared machine), wall ms, cores used (CPU / wall) and
output tokens per CPU-second; the ratio packed / fp32 of tokens per CPU-second. Greedy tokens of
both configurations are compared (bf16-exact weights: the same model, only the summation order
differs). JSON: benchmarks/results/decode_step.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from benchmarks.lib.paths import RESULTS


def _packing(model) -> tuple[list, object]:
    projs = [p for ps in model.lora_projections().values() for p in ps]
    return [(p, p.packed) for p in projs], model.packed_head


def _set_packed(model, saved, on: bool) -> None:
    projs, head = saved
    for p, packed in projs:
        p.packed = packed if on else None
    model.packed_head = head if on else None


def run_config(llm, batch: int, steps: int, rng: random.Random) -> tuple[dict, list[list[int]]]:
    from loraplex.engine import SamplingParams
    from loraplex.engine.request import EngineRequest

    engine = llm.engine
    sp = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    for _ in range(batch):
        engine.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(16)], sp))
    while any(not s.in_decode for s in engine.scheduler.running) or engine.policy.num_waiting():
        engine.step()
    engine.step()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        engine.step()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = [list(s.token_ids[16:]) for s in sorted(engine.scheduler.running, key=lambda s: s.seq_id)]
    for rid in list(engine.requests):
        engine.abort_request(rid)
    return {
        "cpu_ms": 1e3 * cpu / steps,
        "wall_ms": 1e3 * wall / steps,
        "cores": cpu / wall,
        "tok_per_cpu_s": batch * steps / cpu,
        "tok_per_s": batch * steps / wall,
    }, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM

    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    llm = LLM(str(demo_model_dir()), max_num_seqs=max(batches), seed=0)
    model = llm.engine.runner.model
    saved = _packing(model)
    n_packed = sum(p is not None for _, p in saved[0])
    print(f"dtype {llm.engine.runner.dtype}, backend {llm.engine.runner.ops.name}, {n_packed} packed projections")
    if not n_packed:
        print("nothing packed here (bf16 model, torch backend, or no AVX-512): no comparison to make")
        return
    configs = [(b, t, packed) for b in batches for t in threads for packed in (False, True)]
    results: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else configs[::-1]
        seed = 1000 + r
        for b, t, packed in order:
            torch.set_num_threads(t)
            _set_packed(model, saved, packed)
            res, tokens = run_config(llm, b, args.steps, random.Random(seed * 100 + b))
            key = f"b{b}-t{t}-{'packed' if packed else 'fp32'}"
            results.setdefault(key, []).append(res | {"tokens": tokens})
            print(f"round {r} {key}: " + json.dumps({k: round(v, 2) for k, v in res.items()}), flush=True)
    _set_packed(model, saved, True)
    print(f"\nper decode step, medians of {args.rounds} rounds x {args.steps} steps (demo model, float32)")
    head = f"{'batch':>5} {'threads':>7} {'config':>11} {'CPU ms':>8} {'wall ms':>8} {'cores':>6} {'tok/CPU-s':>10} {'tok/s':>8} {'ratio':>6} {'same tokens':>11}"
    print(head)
    table = []
    for b in batches:
        for t in threads:
            rows = {}
            for packed in (False, True):
                key = f"b{b}-t{t}-{'packed' if packed else 'fp32'}"
                runs = results[key]
                rows[packed] = {k: statistics.median(x[k] for x in runs) for k in runs[0] if k != "tokens"}
            fp32_runs = results[f"b{b}-t{t}-fp32"]
            packed_runs = results[f"b{b}-t{t}-packed"]
            same = sum(a["tokens"] == c["tokens"] for a, c in zip(fp32_runs, packed_runs))
            for packed in (False, True):
                m = rows[packed]
                ratio = m["tok_per_cpu_s"] / rows[False]["tok_per_cpu_s"]
                name = "packed bf16" if packed else "fp32 GEMM"
                print(
                    f"{b:5d} {t:7d} {name:>11} {m['cpu_ms']:8.1f} {m['wall_ms']:8.1f} {m['cores']:6.2f}"
                    f" {m['tok_per_cpu_s']:10.1f} {m['tok_per_s']:8.1f} {ratio:6.2f} {f'{same}/{len(fp32_runs)}':>11}"
                )
                table.append({"batch": b, "threads": t, "config": name, **m, "ratio_cpu": ratio})
    out = RESULTS / "decode_step.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = {k: [{kk: vv for kk, vv in x.items() if kk != "tokens"} for x in v] for k, v in results.items()}
    out.write_text(json.dumps({"args": vars(args), "table": table, "raw": raw}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
