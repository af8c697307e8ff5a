"""bf16 linear layers: oneDNN on a weight packed once at load vs ``F.linear`` on the plain weight.

    .venv/bin/python -m benchmarks.kernels.cpu_linear_bf16 [--threads 1] [--rows 1,16,64,128,512] [--rounds 5]

SmolLM2-135M's linear shapes (hidden 576, intermediate 1536, vocab 49152) at decode batches and
prefill chunks. Per shape, enough distinct weights are cycled that they do not stay in the cache
(a decode step streams the whole model), and the configurations alternate inside every round (the
order reversed each round) so that the machine's load lands on both alike. CPU time of this
process per call (steadier than wall time on a shared machine); the ratio is plain ÷ packed time
(> 1: the packed weight is faster). Prints the CPU kind and flags, writes
``benchmarks/results/cpu_linear_bf16.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks.lib.paths import RESULTS
from loraplex.kernels import cpu_packed

# name: (in features, out features), as the engine fuses them.
SHAPES = {
    "qkv": (576, 960),
    "o": (576, 576),
    "gate_up": (576, 3072),
    "down": (1536, 576),
    "head": (576, 49152),
}
WORKING_SET = 96 << 20  # bytes of distinct weights per shape: beyond a server's L3 share


def _time(fn, reps: int) -> float:
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,16,64,128,512")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kind = cpu_packed.cpu_kind()
    print(f"CPU: {kind.model} | kind {kind.name} | flags {' '.join(kind.flags)} | load {os.getloadavg()}")
    results = []
    print(f"{'shape':8s} {'rows':>5s} {'plain ms':>9s} {'packed ms':>9s} {'plain/packed':>12s} {'GFLOP/s packed':>14s}")
    for name in args.shapes.split(","):
        k, n = SHAPES[name]
        count = max(1, WORKING_SET // (n * k * 2))
        g = torch.Generator().manual_seed(0)
        weights = [torch.randn(n, k, generator=g).to(torch.bfloat16) for _ in range(count)]
        packed = [cpu_packed.pack_bf16(w) for w in weights]
        if packed[0] is None:
            raise SystemExit(f"no packed bf16 path on this CPU ({kind.name})")
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k).to(torch.bfloat16)
            state = {"i": 0}

            def plain() -> None:
                i = state["i"] = (state["i"] + 1) % count
                torch.nn.functional.linear(x, weights[i])

            def pack() -> None:
                i = state["i"] = (state["i"] + 1) % count
                cpu_packed.linear_bf16(x, packed[i], None)

            reps = max(3, min(200, int(2e8 / (m * n * k)) + count))
            configs = {"plain": plain, "packed": pack}
            times: dict[str, list[float]] = {c: [] for c in configs}
            for fn in configs.values():
                _time(fn, count)  # warm-up: oneDNN builds its kernels for the shape
            for r in range(args.rounds):
                order = list(configs) if r % 2 == 0 else list(reversed(configs))
                for c in order:
                    times[c].append(_time(configs[c], reps))
            p, q = statistics.median(times["plain"]), statistics.median(times["packed"])
            row = {"shape": name, "rows": m, "n": n, "k": k, "plain_ms": p * 1e3, "packed_ms": q * 1e3,
                   "ratio": p / q, "packed_gflops": 2 * m * n * k / q / 1e9}  # fmt: skip
            results.append(row)
            print(f"{name:8s} {m:5d} {p * 1e3:9.3f} {q * 1e3:9.3f} {p / q:12.2f} {row['packed_gflops']:14.1f}")
    out = RESULTS / "cpu_linear_bf16.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"cpu": kind.model, "kind": kind.name, "flags": list(kind.flags), "threads": args.threads,
            "load_before": os.getloadavg(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    out.write_text(json.dumps({"meta": meta, "rows": results}, indent=2))
    print(f"load {os.getloadavg()}; wrote {out}")


if __name__ == "__main__":
    main()
