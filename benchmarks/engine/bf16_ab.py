"""Pair two logs of ``bf16_step --configs X`` runs (whole processes run alternately, A B A B ...).

    .venv/bin/python -m benchmarks.engine.bf16_ab A.log B.log [--name bf16_ab] [--drop-first]

Each log holds one ``BF16_STEP {json}`` line per batch size per run; the i-th run of A is paired
with the i-th run of B (they ran next to each other, so machine load lands on both alike). Per
batch size and phase it prints the median, min and max of the pairwise ratio B ÷ A of CPU time
(> 1: A is faster), the medians of both, whether the greedy tokens matched, the CPU (model and the
flags that matter) and the load average the runs saw. ``--drop-first`` skips each log's first run
(an outside runner's warm-up). JSON: benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.lib.paths import RESULTS

PHASES = ("prefill_cpu_ms", "decode_cpu_ms", "prefill_wall_ms", "decode_wall_ms")


def runs(path: Path) -> dict[int, list[dict]]:
    """batch -> that batch's lines, in run order."""
    out: dict[int, list[dict]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("BF16_STEP "):
            d = json.loads(line.split(" ", 1)[1])
            out.setdefault(d["batch"], []).append(d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--name", default="bf16_ab")
    ap.add_argument("--drop-first", action="store_true")
    args = ap.parse_args()
    from loraplex.kernels import cpu_packed

    kind = cpu_packed.cpu_kind()
    a, b = runs(args.a), runs(args.b)
    table = []
    print(f"CPU: {kind.model} | flags {' '.join(kind.flags)}")
    print(
        f"{'batch':>5} {'phase':>15} {'A median':>9} {'B median':>9} {'B/A med':>8} {'min':>6} {'max':>6} {'pairs':>5} {'same tokens':>11} {'load':>10}"
    )
    for batch in sorted(set(a) & set(b)):
        ra, rb = a[batch], b[batch]
        if args.drop_first:
            ra, rb = ra[1:], rb[1:]
        pairs = list(zip(ra, rb))
        same = sum(x["tokens"] == y["tokens"] for x, y in pairs)
        loads = [x["load"] for x in ra + rb]
        for phase in PHASES:
            ratios = [y[phase] / x[phase] for x, y in pairs]
            row = {
                "batch": batch, "phase": phase, "a_config": ra[0]["config"], "b_config": rb[0]["config"],
                "a_median": statistics.median(x[phase] for x in ra), "b_median": statistics.median(y[phase] for y in rb),
                "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                "pairs": len(pairs), "same_tokens": same, "load_min": min(loads), "load_max": max(loads),
            }  # fmt: skip
            table.append(row)
            print(
                f"{batch:5d} {phase:>15} {row['a_median']:9.1f} {row['b_median']:9.1f} {row['ratio_median']:8.2f}"
                f" {row['ratio_min']:6.2f} {row['ratio_max']:6.2f} {len(pairs):5d} {f'{same}/{len(pairs)}':>11}"
                f" {min(loads):4.1f}-{max(loads):4.1f}"
            )
    meta = {"cpu": kind.model, "kind": kind.name, "flags": list(kind.flags), "a": str(args.a), "b": str(args.b),
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    out = RESULTS / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "table": table}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
