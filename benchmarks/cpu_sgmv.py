"""Grouped native CPU SGMV vs the torch gather path, at SmolLM2's LoRA shapes (rank 16, 64 tokens).

    .venv/bin/python benchmarks/cpu_sgmv.py [--threads 1] [--iters 50]

For 1 / 8 / 64 distinct adapters over a 64-token decode batch and each fused projection (q|k|v,
gate|up, down), the time of shrink + expand per call (median of --iters after warm-up; wall, or
process CPU time with ``--cpu-time``, steadier on a shared machine), in ``--dtype``. Also: the base
projection's GEMM at the same batch (what the LoRA adds to), and the bandwidth the native kernel
reaches over the adapters' A and B bytes (each distinct adapter's A and B are read once a call),
to compare with a plain streaming read of this process (printed first).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from loraplex.kernels import cpu_native, make_lora_segments, reference

SHAPES = {"qkv": (576, [576, 192, 192]), "o": (576, [576]), "gate_up": (576, [1536, 1536]), "down": (1536, [576])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
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
    print(f"streaming read: {big.numel() * 4 / min(reads) / 1e9:.1f} GB/s ({args.threads} thread(s))")
    print(
        f"{'adapters':>8s} {'proj':8s} {'torch ms':>9s} {'native ms':>9s} {'speed-up':>8s} {'base mm ms':>10s}"
        f" {'LoRA MB':>8s} {'native GB/s':>11s}"
    )
    for n in (1, 8, 64):
        for name, (hidden, widths) in SHAPES.items():
            g = torch.Generator().manual_seed(0)
            a = torch.randn(len(widths), slots, rank, hidden, generator=g).to(dt)
            b = torch.randn(slots, rank, sum(widths), generator=g).to(dt)
            ranks, scales = torch.full((slots,), rank, dtype=torch.int32), torch.ones(slots)
            offsets = tuple([0, *torch.tensor(widths).cumsum(0).tolist()])
            seg = make_lora_segments(sorted(i % n for i in range(args.tokens)))
            x, y = torch.randn(args.tokens, hidden).to(dt), torch.randn(args.tokens, sum(widths)).to(dt)
            w = torch.randn(sum(widths), hidden, generator=g).to(dt)
            times = {}
            mm = []
            for i in range(args.iters + 3):
                t0 = clock()
                torch.nn.functional.linear(x, w)
                if i >= 3:
                    mm.append(clock() - t0)
            for label, mod in (("torch", reference), ("native", cpu_native)):
                samples = []
                for i in range(args.iters + 3):
                    t0 = clock()
                    mod.sgmv_expand(y, mod.sgmv_shrink(x, a, seg, ranks), b, seg, ranks, scales, offsets)
                    if i >= 3:
                        samples.append(clock() - t0)
                times[label] = statistics.median(samples) * 1e3
            lora_mb = n * (a[:, 0].numel() + b[0].numel()) * a.element_size() / 1e6
            print(
                f"{n:8d} {name:8s} {times['torch']:9.3f} {times['native']:9.3f} {times['torch'] / times['native']:8.1f}"
                f" {statistics.median(mm) * 1e3:10.3f} {lora_mb:8.2f} {lora_mb / times['native']:11.2f}"
            )


if __name__ == "__main__":
    main()
