"""Whole prompts' attention on the native vdpbf16ps kernel vs torch's SDPA: the op alone, then
serving-shaped engine traffic, in one process.

    .venv/bin/python -m loraplex.engine.runtime_env -m benchmarks.engine.prompt_attention [--concurrency 16,64] [--rounds 3]

Both are what ``cpu_native.paged_prefill_attention`` runs for a prefill chunk that is a whole
prompt of >= 64 tokens: ``prompt kernel`` (csrc/cpu_prompt_attention.cpp, the default for bf16 on
a CPU with AVX512-BF16) and ``SDPA`` (``prompt_kernel=False``: torch's CPU flash attention, one
batched call per prompt length, what ran before).

1. The op alone (bf16, SmolLM2's 9 query / 3 KV heads x 64, paged cache of 16-token blocks): ms per
   layer call for n prompts of L tokens, best of 5 x 20 calls, and GFLOP/s over the causal FLOPs.
2. The engine (the demo model, bf16, the default CPU path): ``concurrency`` clients each send a
   random 128-token prompt and read 64 greedy tokens (ignore_eos), a new prompt as soon as one
   ends, ``2 x concurrency`` requests in all: the shape of ``vllm bench serve`` at that concurrency
   (at 64 clients ~2 new prompts join every decode step). One LLM; the attention op is swapped
   between runs, order reversed every round, every run with prompts of its own (a repeated prompt
   would be a prefix-cache hit, no prefill); output tok/s (wall) and per CPU-second, and the mean
   wall of a step that carried prompt tokens. (Agreement of the two paths' numbers: the op's
   tests against a float64 oracle, tests/kernels/test_cpu_prompt_attention.py.)
CPU model and flags with the table. JSON: benchmarks/results/prompt_attention.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import time

from benchmarks.lib.paths import RESULTS
from benchmarks.lib.serve_shaped import alternating, serve_shaped

OP_CASES = ((64, 1), (128, 2), (128, 16), (300, 3), (1024, 1), (2048, 1))


def op_alone() -> list[dict]:
    import torch

    from loraplex.kernels import cpu_native

    hq, hkv, d, bs = 9, 3, 64, 16
    rows = []
    for length, n in OP_CASES:
        g = torch.Generator().manual_seed(length + n)
        per = -(-length // bs)
        k_cache = torch.randn(n * per + 8, bs, hkv, d, generator=g).bfloat16()
        v_cache = torch.randn(n * per + 8, bs, hkv, d, generator=g).bfloat16()
        tables = torch.randperm(n * per + 8, generator=g)[: n * per].to(torch.int32).view(n, per)
        q = torch.randn(n * length, hq, d, generator=g).bfloat16()
        qsl = torch.arange(0, (n + 1) * length, length, dtype=torch.int32)
        ctx = torch.full((n,), length, dtype=torch.int32)
        ms = {}
        for name, kernel in (("prompt kernel", True), ("SDPA", False)):
            call = functools.partial(
                cpu_native.paged_prefill_attention, q, k_cache, v_cache, tables, qsl, ctx, d**-0.5, prompt_kernel=kernel
            )
            call()
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(20):
                    call()
                best = min(best, (time.perf_counter() - t0) / 20)
            ms[name] = 1e3 * best
        causal_flops = 2 * 2 * n * hq * d * length * (length + 1) / 2
        rows.append(
            {
                "prompt_len": length,
                "prompts": n,
                "ms": ms,
                "gflop_s": {k: causal_flops / v / 1e6 for k, v in ms.items()},
                "sdpa_over_kernel": ms["SDPA"] / ms["prompt kernel"],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM
    from loraplex.kernels import cpu_native
    from loraplex.kernels.cpu_packed import cpu_kind

    kind = cpu_kind()
    print(f"CPU: {kind.model}; kind {kind.name}; flags {' '.join(kind.flags)}; threads {torch.get_num_threads()}")
    if not cpu_native.prompt_kernel_isa():
        print("this build has no AVX512-BF16 prompt kernel: nothing to compare")
        return
    op_rows = op_alone()
    print("\n1. the op alone (ms per layer call; GFLOP/s over the causal FLOPs)")
    print(
        f"{'prompts':>8s} {'len':>5s} {'kernel ms':>10s} {'SDPA ms':>9s} {'SDPA/kernel':>11s} {'kernel GF/s':>11s} {'SDPA GF/s':>9s}"
    )
    for r in op_rows:
        print(
            f"{r['prompts']:8d} {r['prompt_len']:5d} {r['ms']['prompt kernel']:10.3f} {r['ms']['SDPA']:9.3f} "
            f"{r['sdpa_over_kernel']:11.2f} {r['gflop_s']['prompt kernel']:11.1f} {r['gflop_s']['SDPA']:9.1f}"
        )

    concurrencies = [int(c) for c in args.concurrency.split(",")]
    llm = LLM(str(demo_model_dir()), max_num_seqs=max(concurrencies), seed=0)
    plain = llm.engine.runner.ops
    variants = {
        "prompt kernel": plain,
        "SDPA": dataclasses.replace(
            plain, paged_prefill_attention=functools.partial(plain.paged_prefill_attention, prompt_kernel=False)
        ),
    }
    serve_shaped(llm, 4, plain, seed=-1)  # warm-up
    engine_rows = []
    for conc in concurrencies:
        row: dict = {"concurrency": conc, **alternating(llm, variants, conc, args.rounds, seed=10 * conc)}
        row["kernel_over_sdpa_tok_s"] = row["prompt kernel"]["tok_s"] / row["SDPA"]["tok_s"]
        engine_rows.append(row)
    llm.engine.runner.ops = plain
    print(
        f"\n2. the engine, serving-shaped (medians of {args.rounds} alternating rounds; load {os.getloadavg()[0]:.2f})"
    )
    print(f"{'clients':>7s} {'path':>14s} {'tok/s':>7s} {'tok/CPU-s':>9s} {'prompt step ms':>14s}  rounds tok/s")
    for row in engine_rows:
        for name in variants:
            r = row[name]
            rounds = " / ".join(f"{v:.1f}" for v in r["per_round_tok_s"])
            print(
                f"{row['concurrency']:7d} {name:>14s} {r['tok_s']:7.1f} {r['tok_per_cpu_s']:9.1f} "
                f"{r['prompt_step_ms']:14.1f}  {rounds}"
            )
        print(f"{'':7s} kernel / SDPA tok/s {row['kernel_over_sdpa_tok_s']:.3f}")
    out = RESULTS / "prompt_attention.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cpu = {"model": kind.model, "kind": kind.name, "flags": kind.flags}
    out.write_text(json.dumps({"args": vars(args), "cpu": cpu, "op": op_rows, "engine": engine_rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
