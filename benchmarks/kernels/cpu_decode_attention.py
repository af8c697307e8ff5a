"""Native CPU paged DECODE attention (one query row per sequence), A/B against an older build.

    .venv/bin/python -m benchmarks.kernels.cpu_decode_attention [--threads 1,2] [--batch 16,64]
        [--ctx 64,128,256,512] [--iters 9] [--baseline HEAD] [--dtype bfloat16]

Demo-model shape (SmolLM2-135M: hq 9, hkv 3, d 64, 16-token blocks). For each (threads, batch,
context) the time of one ``paged_decode_attention`` call (one layer for the whole batch): median
wall time and median process CPU time (all threads; OpenMP's spin-wait counts too) over --iters
samples, and the bandwidth over the K and V bytes the call reads (batch x ctx x hkv x d x 2).

Cold like a serving step (30 layers of KV far beyond the L3): each sample walks several copies of
the caches (>= 96 MB together), one call each, so every call reads its KV from memory.

``--baseline REF`` builds the kernel library with ``kernels/csrc/cpu_attention.cpp`` as of git REF
(the other sources and headers as checked out) and alternates its calls with the current build's
in the same process, the order rotated every round; printed: both medians and the median and
min-max of the per-sample ratios new / old (CPU time).
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
from loraplex.kernels import cpu_native

HQ, HKV, D, BLOCK = 9, 3, 64, 16
COLD_BYTES = 96 << 20


def build_baseline(ref: str) -> ctypes.CDLL:
    """The kernel library with cpu_attention.cpp from git ``ref`` (the rest of the sources as they are)."""
    return build_with_old_source(ref, "cpu_attention.cpp")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", default="16,64")
    ap.add_argument("--ctx", default="64,128,256,512")
    ap.add_argument("--iters", type=int, default=9, help="samples per configuration")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--baseline", default="HEAD", help="git ref of an older cpu_attention.cpp ('' = none)")
    ap.add_argument("--out", default="cpu_decode_attention")
    args = ap.parse_args()
    assert cpu_native.available(), "native kernels did not build"
    new_lib = cpu_native._lib
    old_lib = build_baseline(args.baseline) if args.baseline else None
    dt = getattr(torch, args.dtype)
    esize = torch.tensor([], dtype=dt).element_size()
    hdr = f"{'thr':>3s} {'batch':>5s} {'ctx':>4s} {'new ms':>7s} {'cpu ms':>7s} {'GB/s':>6s}"
    if old_lib is not None:
        hdr += f" {'old ms':>7s} {'cpu ms':>7s} {'GB/s':>6s} {'new/old':>7s} {'min-max':>11s}"
    print(hdr)
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for batch in (int(b) for b in args.batch.split(",")):
            for ctx in (int(c) for c in args.ctx.split(",")):
                nb = -(-ctx // BLOCK)
                kv_bytes = 2 * batch * ctx * HKV * D * esize
                copies = max(2, -(-COLD_BYTES // kv_bytes))
                g = torch.Generator().manual_seed(0)
                caches = [
                    (
                        torch.randn(batch * nb + 1, BLOCK, HKV, D, generator=g).to(dt),
                        torch.randn(batch * nb + 1, BLOCK, HKV, D, generator=g).to(dt),
                    )
                    for _ in range(copies)
                ]
                bt = torch.randperm(batch * nb, generator=g).to(torch.int32).reshape(batch, nb)
                cl = torch.full((batch,), ctx, dtype=torch.int32)
                q = torch.randn(batch, HQ, D, generator=g).to(dt)

                def native(lib: ctypes.CDLL | None) -> Callable[[], None]:
                    def call() -> None:
                        cpu_native._lib = lib
                        for k, v in caches:
                            cpu_native.paged_decode_attention(q, k, v, bt, cl, 0.125)
                        cpu_native._lib = new_lib

                    return call

                calls: dict[str, Callable[[], None]] = {"new": native(new_lib)}
                if old_lib is not None:
                    calls["old"] = native(old_lib)
                wall: dict[str, list[float]] = {k: [] for k in calls}
                cpu: dict[str, list[float]] = {k: [] for k in calls}
                order = list(calls)
                for i in range(args.iters + 1):
                    for k in order[i % len(order) :] + order[: i % len(order)]:
                        t0, c0 = time.perf_counter(), time.process_time()
                        calls[k]()
                        if i >= 1:  # the first round warms up
                            wall[k].append((time.perf_counter() - t0) / copies)
                            cpu[k].append((time.process_time() - c0) / copies)
                ms = {k: statistics.median(v) * 1e3 for k, v in wall.items()}
                cms = {k: statistics.median(v) * 1e3 for k, v in cpu.items()}
                mb = kv_bytes / 1e6
                line = f"{threads:3d} {batch:5d} {ctx:4d} {ms['new']:7.3f} {cms['new']:7.3f} {mb / ms['new']:6.2f}"
                row = {
                    "threads": threads,
                    "batch": batch,
                    "ctx": ctx,
                    "new_ms": ms["new"],
                    "new_cpu_ms": cms["new"],
                    "new_gbs": mb / ms["new"],
                }
                if old_lib is not None:
                    ratios = [a / b for a, b in zip(cpu["new"], cpu["old"])]
                    r_med, r_lo, r_hi = statistics.median(ratios), min(ratios), max(ratios)
                    line += f" {ms['old']:7.3f} {cms['old']:7.3f} {mb / ms['old']:6.2f} {r_med:7.2f} {r_lo:5.2f}-{r_hi:<5.2f}"
                    row.update(
                        old_ms=ms["old"],
                        old_cpu_ms=cms["old"],
                        old_gbs=mb / ms["old"],
                        ratio=r_med,
                        ratio_min=r_lo,
                        ratio_max=r_hi,
                    )
                print(line, flush=True)
                rows.append(row)
                caches.clear()  # free this configuration's copies before the next
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    out = write_cpu_result(args.out, {"args": vars(args), "commit": commit.strip()}, rows=rows)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
