"""Grouped native CPU SGMV vs the torch gather path, at SmolLM2's LoRA shapes (rank 16, 64 tokens).

    .venv/bin/python -m benchmarks.kernels.cpu_sgmv [--threads 1] [--iters 50] [--cpu-time] [--dtype float32]

For 1 / 8 / 64 distinct adapters over a 64-token decode batch and each fused projection (q|k|v,
gate|up, down), the time of shrink + expand per call (median of --iters after warm-up; wall, or
process CPU time with ``--cpu-time``, steadier on a shared machine), in ``--dtype``. Also: the base
projection's GEMM at the same batch (what the LoRA adds to), and the bandwidth the native kernel
reaches over the adapters' A and B bytes (each distinct adapter's A and B are read once a call),
to compare with a plain streaming read of this process (printed first). The native kernel runs
twice: adapter weights stored in the activation dtype and in float16 (``lora_dtype``); the calls
alternate within each round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.lib.paths import RESULTS
from loraplex.kernels import cpu_native, make_lora_segments, reference

SHAPES = {"qkv": (576, [576, 192, 192]), "o": (576, [576]), "gate_up": (576, [1536, 1536]), "down": (1536, [576])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"], help="activations")
    ap.add_argument("--adapters", default="1,8,64")
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time instead of wall time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert cpu_native.available(), "native kernels did not build"
    clock = time.process_time if args.cpu_time else time.perf_counter
    dt, slots, rank = getattr(torch, args.dtype), 64, 16
    big = torch.ones(32 << 20)
    reads = []
    for _ in range(5):
        t0 = clock()
        big.sum()
        reads.append(clock() - t0)
    stream = big.numel() * 4 / min(reads) / 1e9
    del big
    print(f"streaming read: {stream:.1f} GB/s ({args.threads} thread(s)); activations {args.dtype}")
    # Adapter weights stored in the activation dtype, and in float16 (lora_dtype="float16").
    storages = {"same": dt, "fp16": torch.float16}
    hdr = f"{'adapters':>8s} {'proj':8s} {'torch ms':>9s} {'base mm ms':>10s}"
    for k in storages:
        hdr += f" {'native ' + k + ' ms':>15s} {'GB/s':>6s}"
    print(hdr)
    rows = []
    for n in (int(c) for c in args.adapters.split(",")):
        for name, (hidden, widths) in SHAPES.items():
            g = torch.Generator().manual_seed(0)
            a32 = torch.randn(len(widths), slots, rank, hidden, generator=g) * 0.05
            b32 = torch.randn(slots, rank, sum(widths), generator=g) * 0.05
            ranks, scales = torch.full((slots,), rank, dtype=torch.int32), torch.ones(slots)
            offsets = tuple([0, *torch.tensor(widths).cumsum(0).tolist()])
            seg = make_lora_segments(sorted(i % n for i in range(args.tokens)))
            x, y = torch.randn(args.tokens, hidden).to(dt), torch.randn(args.tokens, sum(widths)).to(dt)
            w = torch.randn(sum(widths), hidden, generator=g).to(dt)
            weights = {k: (a32.to(d), b32.to(d)) for k, d in storages.items()}
            calls = {
                "torch": lambda: reference.sgmv_expand(
                    y,
                    reference.sgmv_shrink(x, weights["same"][0], seg, ranks),
                    weights["same"][1],
                    seg,
                    ranks,
                    scales,
                    offsets,
                ),
                "mm": lambda: torch.nn.functional.linear(x, w),
            }
            for k in storages:
                a, b = weights[k]
                calls[k] = lambda a=a, b=b: cpu_native.sgmv_expand(
                    y, cpu_native.sgmv_shrink(x, a, seg, ranks), b, seg, ranks, scales, offsets
                )
            samples: dict[str, list[float]] = {k: [] for k in calls}
            for i in range(args.iters + 3):  # alternating, one call of each per round
                for k, fn in calls.items():
                    t0 = clock()
                    fn()
                    if i >= 3:
                        samples[k].append(clock() - t0)
            ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
            line = f"{n:8d} {name:8s} {ms['torch']:9.3f} {ms['mm']:10.3f}"
            row = {"adapters": n, "proj": name, "torch_ms": ms["torch"], "base_mm_ms": ms["mm"]}
            for k in storages:
                a, b = weights[k]
                mb = n * (a[:, 0].numel() + b[0].numel()) * a.element_size() / 1e6
                line += f" {ms[k]:15.3f} {mb / ms[k]:6.2f}"
                row[f"native_{k}_ms"], row[f"native_{k}_gbs"] = ms[k], mb / ms[k]
            print(line, flush=True)
            rows.append(row)
    out = RESULTS / "cpu_sgmv.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "streaming_gbs": stream, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
