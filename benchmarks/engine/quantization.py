"""fp32 / bf16 weights vs INT8 weight-only, on one random Llama (the ~24M-parameter bench preset).

    .venv/bin/python -m benchmarks.engine.quantization            # ~2-3 minutes on 2 cores
    .venv/bin/python -m benchmarks.engine.quantization --quick    # smoke run

Per configuration: weight bytes (parameters + persistent buffers), how many more KV blocks of that
dtype the weight saving would pay for (saved bytes / bytes per KV block), decode output tok/s at
batch 1 and batch 32 (steady state: every sequence decodes ``--tokens`` tokens, prefill excluded
by timing only after the first token), and greedy agreement with the fp32 model (fraction of
sequences whose whole output is identical, and the mean number of leading tokens that agree).
Also a micro-benchmark of the int8 CPU op against dense F.linear per row count, which is how
``INT8PACK_MAX_ROWS`` was chosen. All runs in one process, one after another: compare ratios.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.lib.workload import print_table, write_json
from loraplex.engine import LLM, SamplingParams
from loraplex.engine.demo_model import create_random_checkpoint
from loraplex.engine.models.quantization import weight_bytes
from loraplex.kernels import quantize_per_channel_int8
from loraplex.kernels.int8 import int8_linear_cpu

CONFIGS = [
    ("fp32", "float32", None),
    ("int8 (fp32 act)", "float32", "int8"),
    ("bf16", "bfloat16", None),
    ("int8 (bf16 act)", "bfloat16", "int8"),
]


def decode_tok_s(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    """Output tokens per second of the decode phase: all prompts prefilled first, then timed."""
    eng = llm.engine
    params = SamplingParams(max_tokens=tokens + 1, temperature=0.0, ignore_eos=True)
    for p in prompts:
        eng.add_request(p, params)
    while any(s.num_output_tokens == 0 for r in eng.requests.values() for s in r.sequences):
        eng.step()
    start = CLOCK()
    generated = 0
    while eng.has_unfinished_requests():
        before = eng.counters["generated_tokens"]
        eng.step()
        generated += eng.counters["generated_tokens"] - before
    return generated / (CLOCK() - start)


def op_micro(rows: list[int], k: int, n: int, reps: int) -> list[dict]:
    w = torch.randn(n, k)
    q, s = quantize_per_channel_int8(w)
    out = []
    for m in rows:
        row = {"rows": m}
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            x = torch.randn(m, k).to(dt)
            wd = w.to(dt)
            row[f"dense {name} us"] = _time(lambda x=x, wd=wd: F.linear(x, wd), reps)
            row[f"int8 {name} us"] = _time(lambda x=x: int8_linear_cpu(x, q, s), reps)
        out.append(row)
    return out


CLOCK = time.perf_counter  # --cpu-time: process CPU time, steadier than wall time on a shared machine


def _time(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t = CLOCK()
        for _ in range(reps):
            fn()
        best = min(best, (CLOCK() - t) / reps)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--cpu-time", action="store_true", help="time with process CPU time instead of wall time")
    ap.add_argument("--op-only", action="store_true", help="only the int8 op micro-benchmark")
    args = ap.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    torch.manual_seed(0)
    tokens = 8 if args.quick else args.tokens
    preset = "demo" if args.quick else "bench"
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(create_random_checkpoint(Path(tmp) / "m", preset=preset, seed=3, initializer_range=0.05))
        rng = random.Random(0)
        prompts = [[rng.randrange(10, 700) for _ in range(rng.randint(16, 48))] for _ in range(32)]
        rows, fp32_outputs, fp32_bytes = [], None, None
        for name, dtype, quant in [] if args.op_only else CONFIGS:
            llm = LLM(
                model=model_dir,
                dtype=dtype,
                quantization=quant,
                kernel_backend="torch",
                max_num_seqs=32,
                max_num_batched_tokens=2048,
            )
            wb = weight_bytes(llm.engine.runner.model)
            if fp32_bytes is None:
                fp32_bytes = wb
            mc, bs = llm.engine.model_config, llm.engine.kv.block_size
            per_block = 2 * mc.num_layers * bs * mc.num_kv_heads * mc.head_dim * (4 if dtype == "float32" else 2)
            outs = [
                o.outputs[0].token_ids
                for o in llm.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
            ]
            if fp32_outputs is None:
                fp32_outputs = outs
            same = sum(o == r for o, r in zip(outs, fp32_outputs)) / len(outs)
            lead = sum(
                next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), len(r)) for o, r in zip(outs, fp32_outputs)
            ) / len(outs)
            rows.append(
                {
                    "config": name,
                    "weight MiB": wb / 2**20,
                    "x fp32": wb / fp32_bytes,
                    "KV blocks bought": (fp32_bytes - wb) // per_block,
                    "tok/s b1": decode_tok_s(llm, prompts[:1], tokens * 2),
                    "tok/s b32": decode_tok_s(llm, prompts, tokens),
                    "greedy = fp32": same,
                    "lead tokens = fp32": lead,
                }
            )
            print(rows[-1], flush=True)
            del llm
        cols = [
            "config",
            "weight MiB",
            "x fp32",
            "KV blocks bought",
            "tok/s b1",
            "tok/s b32",
            "greedy = fp32",
            "lead tokens = fp32",
        ]
        clock = "process CPU time" if args.cpu_time else "wall time"
        if rows:
            print(f"\nmodel preset {preset!r}, {tokens} output tokens, {torch.get_num_threads()} threads, {clock}")
            print_table(rows, cols)
        k, n = (512, 1408) if not args.quick else (128, 352)
        micro = op_micro([1, 4, 8, 16, 32, 64], k, n, reps=5 if args.quick else 20)
        print(f"\nint8 CPU op vs dense F.linear, [rows, {k}] x [{k}, {n}] (microseconds of {clock}, best of 3)")
        print_table(micro, list(micro[0]))
        path = write_json("quantization", {"preset": preset, "tokens": tokens, "engine": rows, "op": micro})
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
