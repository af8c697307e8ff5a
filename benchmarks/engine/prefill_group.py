"""How many prompt tokens one CPU engine step needs before prefill runs at its full rate (issue 33, item 2).

    .venv/bin/python -m benchmarks.engine.prefill_group [--groups 1,2,4,8,16] [--prompt 128] [--rounds 3]

A burst of prompts prefilled in ONE step gives every prompt its first token at the end of the whole
burst: TTFT p50 = the burst's time. Prefilled a group at a time, the first groups stream early, and
the burst costs no more CPU as long as each group is past the size where the step's GEMMs reach
their full rate. This measures that size on the CPU it runs on, which is where the engine's
``prefill_group_tokens`` per CPU kind (``loraplex.kernels.cpu_packed.PREFILL_GROUP_TOKENS``) comes
from.

One ``LLM`` on the demo model (SmolLM2-135M-Instruct) in bf16 on the native CPU backend (packed
linears on a bf16 CPU), ``--threads`` torch threads, grouping off (``prefill_group_tokens=0``).
For each group size G (alternating order per round): G prompts of ``--prompt`` random tokens
admitted at once with nothing decoding, the one step that prefills them timed (CPU time of this
process; wall beside it), then the group aborted. Prefix caching is off (random prompts would not
hit anyway). Prints prompt tokens per CPU-second per group and the ratio to the largest group.
JSON: benchmarks/results/prefill_group.json (CPU model, kind, flags, load).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from benchmarks.lib.cpu_result import write_cpu_result


def prefill_once(llm, group: int, prompt: int, rng: random.Random) -> tuple[float, float]:
    from loraplex.engine import SamplingParams
    from loraplex.engine.request import EngineRequest

    engine = llm.engine
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for _ in range(group):
        engine.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(prompt)], sp))
    t0, c0 = time.perf_counter(), time.process_time()
    engine.step()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert all(s.in_decode for s in engine.scheduler.running), "the group did not fit one step"
    for rid in list(engine.requests):
        engine.abort_request(rid)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", default="1,2,4,8,16")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM
    from loraplex.kernels import cpu_packed

    torch.set_num_threads(args.threads)
    kind = cpu_packed.cpu_kind()
    print(f"CPU: {kind.model} | kind {kind.name} | flags {' '.join(kind.flags)} | threads {args.threads}")
    groups = [int(g) for g in args.groups.split(",")]
    llm = LLM(
        str(demo_model_dir()),
        dtype=args.dtype,
        kernel_backend="cpu",
        max_num_seqs=max(groups),
        max_num_batched_tokens=max(groups) * args.prompt,
        prefill_group_tokens=0,
        enable_prefix_caching=False,
        seed=0,
    )
    prefill_once(llm, max(groups), args.prompt, random.Random(-1))  # warm-up (oneDNN primitives, caches)
    rows: dict[int, list[tuple[float, float]]] = {g: [] for g in groups}
    for r in range(args.rounds):
        for g in groups if r % 2 == 0 else groups[::-1]:
            rows[g].append(prefill_once(llm, g, args.prompt, random.Random(1000 * r + g)))
    big = max(groups)
    rate = {g: g * args.prompt / statistics.median(c for c, _ in rows[g]) for g in groups}
    print(f"\nmedians of {args.rounds} rounds, {args.prompt}-token prompts, {args.dtype}")
    print(
        f"{'group':>5} {'tokens':>6} {'step CPU ms':>11} {'step wall ms':>12} {'prompt tok/CPU-s':>16} {'of largest':>10}"
    )
    table = []
    for g in groups:
        cpu = statistics.median(c for c, _ in rows[g])
        wall = statistics.median(w for _, w in rows[g])
        print(
            f"{g:5d} {g * args.prompt:6d} {1e3 * cpu:11.1f} {1e3 * wall:12.1f} {rate[g]:16.0f} {rate[g] / rate[big]:10.2f}"
        )
        table.append({"group": g, "tokens": g * args.prompt, "step_cpu_ms": 1e3 * cpu, "step_wall_ms": 1e3 * wall,
                      "prompt_tok_per_cpu_s": rate[g], "of_largest": rate[g] / rate[big]})  # fmt: skip
    knee = next((t["tokens"] for t in table if t["of_largest"] >= 0.9), None)
    print(f"smallest group within 90% of the largest group's rate: {knee} prompt tokens")
    print(f"wrote {write_cpu_result('prefill_group', {'args': vars(args), 'knee_tokens': knee}, table=table)}")


if __name__ == "__main__":
    main()
