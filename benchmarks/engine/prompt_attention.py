"""Prompt chunks' attention on the native vdpbf16ps kernel vs what ran before it (torch's SDPA for
whole prompts, the native paged tile for other chunks): the op alone, then serving-shaped engine
traffic, in one process.

    .venv/bin/python -m loraplex.engine.runtime_env -m benchmarks.engine.prompt_attention [--concurrency 16,64] [--rounds 3]

Both are what ``cpu_native.paged_prefill_attention`` runs for a prefill chunk that is a whole
prompt of >= 64 tokens: ``prompt kernel`` (csrc/cpu_prompt_attention.cpp, the default for bf16 on
a CPU with AVX512-BF16) and ``SDPA`` (``prompt_kernel=False``: torch's CPU flash attention, one
batched call per prompt length, what ran before).

1. The op alone (bf16, SmolLM2's 9 query / 3 KV heads x 64, paged cache of 16-token blocks): ms per
   layer call for n prompts of L tokens, best of 5 x 20 calls, and GFLOP/s over the causal FLOPs;
   then chunks over cached positions (``rows`` query rows after ``offset`` cached keys: a chunked
   prompt's later chunk, a prompt after a prefix hit) and whole prompts under 64 tokens, where the
   alternative is the native paged tile (``prompt_kernel=False``).
2. The engine (the demo model, bf16, the default CPU path): ``concurrency`` clients each send a
   random 128-token prompt and read 64 greedy tokens (ignore_eos), a new prompt as soon as one
   ends, ``2 x concurrency`` requests in all: the shape of ``vllm bench serve`` at that concurrency;
   then ``--long-prompt`` tokens at the first concurrency (a prompt joining decodes is prefilled
   128 tokens a step: all chunks but the first are over cached positions)
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
# (query rows, cached keys before them, sequences): a 128-token prompt's second chunk at the chunk
# sizes the prompt room makes (32, 48, 64 rows), longer prefixes, and short whole prompts (offset 0).
CHUNK_CASES = ((16, 0, 1), (32, 0, 1), (48, 0, 1), (32, 96, 1), (48, 80, 1), (64, 64, 1), (64, 64, 2), (64, 448, 1))
CHUNK_CASES += ((128, 896, 1), (16, 496, 4))


def _op_case(rows: int, offset: int, n: int) -> dict:
    """``n`` sequences of ``rows`` query rows after ``offset`` cached keys (bf16, 9/3 heads x 64,
    16-token blocks): ms per call of paged_prefill_attention with the prompt kernel on and off."""
    import torch

    from loraplex.kernels import cpu_native

    hq, hkv, d, bs = 9, 3, 64, 16
    length = offset + rows
    g = torch.Generator().manual_seed(length + n)
    per = -(-length // bs)
    k_cache = torch.randn(n * per + 8, bs, hkv, d, generator=g).bfloat16()
    v_cache = torch.randn(n * per + 8, bs, hkv, d, generator=g).bfloat16()
    tables = torch.randperm(n * per + 8, generator=g)[: n * per].to(torch.int32).view(n, per)
    q = torch.randn(n * rows, hq, d, generator=g).bfloat16()
    qsl = torch.arange(0, (n + 1) * rows, rows, dtype=torch.int32)
    ctx = torch.full((n,), length, dtype=torch.int32)
    ms = {}
    for kernel in (True, False):
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
        ms[kernel] = 1e3 * best
    return {"kernel_ms": ms[True], "before_ms": ms[False]}


def chunks_alone() -> list[dict]:
    rows = []
    for q_rows, offset, n in CHUNK_CASES:
        t = _op_case(q_rows, offset, n)
        rows.append(
            {"rows": q_rows, "offset": offset, "seqs": n, **t, "before_over_kernel": t["before_ms"] / t["kernel_ms"]}
        )
    return rows


def op_alone() -> list[dict]:
    hq, d = 9, 64
    rows = []
    for length, n in OP_CASES:
        t = _op_case(length, 0, n)
        ms = {"prompt kernel": t["kernel_ms"], "SDPA": t["before_ms"]}
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
    ap.add_argument(
        "--long-prompt",
        type=int,
        default=1024,
        help="also this prompt length at the first concurrency (chunked at 128 beside decodes; 0: skip)",
    )
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
    chunk_rows = chunks_alone()
    print("\n   chunks over cached positions and short whole prompts (ms per layer call; before = paged tile)")
    print(f"{'seqs':>8s} {'rows':>5s} {'offset':>6s} {'kernel ms':>10s} {'tile ms':>9s} {'tile/kernel':>11s}")
    for r in chunk_rows:
        print(
            f"{r['seqs']:8d} {r['rows']:5d} {r['offset']:6d} {r['kernel_ms']:10.3f} {r['before_ms']:9.3f} "
            f"{r['before_over_kernel']:11.2f}"
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
    shapes = [(conc, 128) for conc in concurrencies]
    if args.long_prompt:
        shapes.append((concurrencies[0], args.long_prompt))
    for conc, length in shapes:
        row: dict = {
            "concurrency": conc,
            "prompt_len": length,
            **alternating(llm, variants, conc, args.rounds, seed=10 * conc + length, prompt_len=length),
        }
        row["kernel_over_sdpa_tok_s"] = row["prompt kernel"]["tok_s"] / row["SDPA"]["tok_s"]
        engine_rows.append(row)
    llm.engine.runner.ops = plain
    print(
        f"\n2. the engine, serving-shaped (medians of {args.rounds} alternating rounds; load {os.getloadavg()[0]:.2f})"
    )
    print(
        f"{'clients':>7s} {'prompt':>6s} {'path':>14s} {'tok/s':>7s} {'tok/CPU-s':>9s} {'prompt step ms':>14s}  rounds tok/s"
    )
    for row in engine_rows:
        for name in variants:
            r = row[name]
            rounds = " / ".join(f"{v:.1f}" for v in r["per_round_tok_s"])
            print(
                f"{row['concurrency']:7d} {row['prompt_len']:6d} {name:>14s} {r['tok_s']:7.1f} {r['tok_per_cpu_s']:9.1f} "
                f"{r['prompt_step_ms']:14.1f}  {rounds}"
            )
        print(f"{'':14s} kernel / before tok/s {row['kernel_over_sdpa_tok_s']:.3f}")
    out = RESULTS / "prompt_attention.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cpu = {"model": kind.model, "kind": kind.name, "flags": kind.flags}
    out.write_text(
        json.dumps(
            {"args": vars(args), "cpu": cpu, "op": op_rows, "chunks": chunk_rows, "engine": engine_rows}, indent=2
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
