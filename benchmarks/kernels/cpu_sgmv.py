"""Grouped native CPU SGMV at SmolLM2's LoRA shapes (rank 16, 64 tokens), A/B against an older build.

    .venv/bin/python -m benchmarks.kernels.cpu_sgmv [--threads 1] [--iters 20] [--cpu-time]
        [--dtype bfloat16] [--storage same] [--baseline REF] [--hot] [--torch]

For 1 / 8 / 64 distinct adapters over a 64-token decode batch and each fused projection (q|k|v, o,
gate|up, down), the time of shrink + expand per call (median over --iters samples of --reps calls;
wall, or process CPU time with ``--cpu-time``, steadier on a shared machine). Also: the base
projection's GEMM at the same batch (what the LoRA adds to), and the bandwidth the kernel reaches
over the adapters' A and B bytes (each distinct adapter's A and B are read once a call), beside a
plain streaming read of this process (printed first).

Cold by default: a serving step streams ~625 MB of bf16 adapter weights (64 distinct rank-16
adapters on all seven projections, 30 layers), far beyond the L3, so the calls rotate over enough
copies of the stacked A/B tensors (>= 96 MB) that every call reads them from memory. ``--hot``
repeats one copy (L3-resident: what a small benchmark would otherwise measure).

``--baseline REF`` builds the kernel library with ``kernels/csrc/cpu_sgmv.cpp`` as of git REF (the
other sources as checked out) and alternates its calls with the current build's in the same
process (A B A B, the order rotated every round); printed: both medians and the median and
min-max of the per-sample ratios new ÷ old. ``--storage fp16`` stores the adapters in float16 (``lora_dtype="float16"``).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import time
from collections.abc import Callable

import torch

from benchmarks.lib.cpu_result import write_cpu_result
from benchmarks.lib.native_baseline import build_with_old_source
from benchmarks.lib.paths import ROOT
from loraplex.kernels import cpu_native, cpu_sgmv, make_lora_segments, reference

SHAPES = {"qkv": (576, [576, 192, 192]), "o": (576, [576]), "gate_up": (576, [1536, 1536]), "down": (1536, [576])}
COLD_BYTES = 96 << 20


def build_baseline(ref: str) -> ctypes.CDLL:
    """The kernel library with cpu_sgmv.cpp from git ``ref`` (the rest of the sources as they are)."""
    return build_with_old_source(ref, "cpu_sgmv.cpp")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20, help="samples per configuration")
    ap.add_argument("--reps", type=int, default=4, help="calls per sample")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="activations")
    ap.add_argument("--storage", default="same", choices=["same", "fp16"], help="adapter weights")
    ap.add_argument("--adapters", default="1,8,64")
    ap.add_argument("--projs", default=",".join(SHAPES))
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time instead of wall time")
    ap.add_argument("--baseline", default="", help="git ref of an older cpu_sgmv.cpp to alternate with")
    ap.add_argument("--hot", action="store_true", help="one copy of the weights (L3-resident)")
    ap.add_argument("--torch", action="store_true", help="also the torch gather path (slow)")
    ap.add_argument("--out", default="cpu_sgmv")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert cpu_native.available(), "native kernels did not build"
    new_lib = cpu_native._lib
    old_lib = build_baseline(args.baseline) if args.baseline else None
    clock = time.process_time if args.cpu_time else time.perf_counter
    dt, slots, rank = getattr(torch, args.dtype), 64, 16
    wdt = dt if args.storage == "same" else torch.float16
    big = torch.ones(32 << 20)
    reads = []
    for _ in range(5):
        t0 = clock()
        big.sum()
        reads.append(clock() - t0)
    stream = big.numel() * 4 / min(reads) / 1e9
    del big
    print(
        f"streaming read: {stream:.1f} GB/s ({args.threads} thread(s)); activations {args.dtype}, "
        f"adapters {wdt}, {'hot' if args.hot else 'cold'}, {'CPU' if args.cpu_time else 'wall'} time"
    )
    hdr = f"{'adapters':>8s} {'proj':8s} {'base mm ms':>10s} {'new ms':>8s} {'GB/s':>6s}"
    if old_lib is not None:
        hdr += f" {'old ms':>8s} {'GB/s':>6s} {'new/old':>7s} {'min-max':>11s}"
    if args.torch:
        hdr += f" {'torch ms':>9s}"
    print(hdr)
    rows = []
    for n in (int(c) for c in args.adapters.split(",")):
        for name in args.projs.split(","):
            hidden, widths = SHAPES[name]
            g = torch.Generator().manual_seed(0)
            a32 = torch.randn(len(widths), slots, rank, hidden, generator=g) * 0.05
            b32 = torch.randn(slots, rank, sum(widths), generator=g) * 0.05
            ranks, scales = torch.full((slots,), rank, dtype=torch.int32), torch.ones(slots)
            offsets = tuple([0, *torch.tensor(widths).cumsum(0).tolist()])
            seg = make_lora_segments(sorted(i % n for i in range(args.tokens)))
            x, y = torch.randn(args.tokens, hidden).to(dt), torch.randn(args.tokens, sum(widths)).to(dt)
            w = torch.randn(sum(widths), hidden, generator=g).to(dt)
            a0, b0 = a32.to(wdt), b32.to(wdt)
            per_copy = (a0.numel() + b0.numel()) * a0.element_size()
            copies = 1 if args.hot else -(-COLD_BYTES // per_copy)
            weights = [(a0.clone(), b0.clone()) for _ in range(copies)]
            pos = [0]

            def native(lib: ctypes.CDLL | None) -> Callable[[], None]:
                def call() -> None:
                    cpu_native._lib = lib
                    for _ in range(args.reps):
                        a, b = weights[pos[0] % copies]
                        pos[0] += 1
                        cpu_sgmv.sgmv_expand(y, cpu_sgmv.sgmv_shrink(x, a, seg, ranks), b, seg, ranks, scales, offsets)
                    cpu_native._lib = new_lib

                return call

            def mm() -> None:
                for _ in range(args.reps):
                    torch.nn.functional.linear(x, w)

            def torch_path() -> None:
                for _ in range(args.reps):
                    a, b = weights[0]
                    reference.sgmv_expand(y, reference.sgmv_shrink(x, a, seg, ranks), b, seg, ranks, scales, offsets)

            calls: dict[str, Callable[[], None]] = {"mm": mm, "new": native(new_lib)}
            if old_lib is not None:
                calls["old"] = native(old_lib)
            if args.torch:
                calls["torch"] = torch_path
            samples: dict[str, list[float]] = {k: [] for k in calls}
            order = list(calls)
            # Alternating, the order rotated every round: each configuration follows each other one
            # equally often and none runs twice in a row (a reversed order ran the end ones twice,
            # the second time with warm code: a bias of ~5-10% on the 0.1 ms calls).
            for i in range(args.iters + 2):
                for k in order[i % len(order) :] + order[: i % len(order)]:
                    t0 = clock()
                    calls[k]()
                    if i >= 2:
                        samples[k].append((clock() - t0) / args.reps)
            ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
            mb = n * (a0[:, 0].numel() + b0[0].numel()) * a0.element_size() / 1e6
            line = f"{n:8d} {name:8s} {ms['mm']:10.3f} {ms['new']:8.3f} {mb / ms['new']:6.2f}"
            row = {"adapters": n, "proj": name, "base_mm_ms": ms["mm"], "new_ms": ms["new"], "new_gbs": mb / ms["new"]}
            if old_lib is not None:
                ratios = [a / b for a, b in zip(samples["new"], samples["old"])]
                r_med, r_lo, r_hi = statistics.median(ratios), min(ratios), max(ratios)
                line += f" {ms['old']:8.3f} {mb / ms['old']:6.2f} {r_med:7.2f} {r_lo:5.2f}-{r_hi:<5.2f}"
                row.update(old_ms=ms["old"], old_gbs=mb / ms["old"], ratio=r_med, ratio_min=r_lo, ratio_max=r_hi)
            if args.torch:
                line += f" {ms['torch']:9.3f}"
                row["torch_ms"] = ms["torch"]
            print(line, flush=True)
            rows.append(row)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    out = write_cpu_result(args.out, {"args": vars(args), "commit": commit.strip()}, streaming_gbs=stream, rows=rows)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
