"""Which process runtime makes loraplex fastest on CPU: allocator x OpenMP runtime x wait policy.

    .venv/bin/python -m benchmarks.peers.runtime_variants [--rounds 2] [--batch 64] [--tokens 32]

Each variant is a fresh process (the allocator and the OpenMP runtime are fixed at process start)
running the same burst with ``LLM(...)`` on the demo model: ``--batch`` random 128-token prompts,
``--tokens`` output tokens each (ignore_eos), optional adapters mixed in. Variants run alternately
(A B C .., .. C B A) and the table shows medians of output tok/s (wall) and output tokens per
CPU-second of the process (robust to other load on a shared machine). The auto re-exec is off in
the children (``LORAPLEX_FAST_RUNTIME=0``): each variant's environment is exactly what it says.
JSON: benchmarks/results/runtime_variants.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.lib.paths import RESULTS

CHILD = r"""
import json, random, resource, sys, time
import torch
from loraplex.engine import LLM, SamplingParams
from loraplex.engine import runtime_env
cfg = json.loads(sys.argv[1])
llm = LLM(cfg["model"], max_num_seqs=cfg["batch"], max_loras=max(1, len(cfg["adapters"])),
          max_cpu_loras=max(1, len(cfg["adapters"])), seed=0)
names = sorted(cfg["adapters"])
for n in names:
    llm.add_adapter(n, cfg["adapters"][n])
rng = random.Random(0)
prompts = [[rng.randrange(100, 20000) for _ in range(128)] for _ in range(cfg["batch"])]
adapters = [names[i % len(names)] if names else None for i in range(cfg["batch"])]
sp = SamplingParams(max_tokens=cfg["tokens"], temperature=0.0, ignore_eos=True)
llm.generate(prompts[:4], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), adapters=adapters[:4])
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
outs = llm.generate(prompts, sp, adapters=adapters)
wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
toks = sum(len(o.outputs[0].token_ids) for o in outs)
print(json.dumps({"tok_s": toks / wall, "tok_per_cpu_s": toks / cpu, "cores": cpu / wall,
                  "runtime": runtime_env.describe(), "threads": torch.get_num_threads()}))
"""


def variants() -> dict[str, dict[str, str]]:
    from loraplex.engine import runtime_env

    p = runtime_env.plan()
    out: dict[str, dict[str, str]] = {"glibc + GNU OpenMP (as started)": {}}
    out["glibc + GNU OpenMP, OMP_WAIT_POLICY=PASSIVE"] = dict(runtime_env.GOMP_FALLBACK_ENV)
    if p.tcmalloc:
        out["tcmalloc + GNU OpenMP, PASSIVE"] = {"LD_PRELOAD": p.tcmalloc, **runtime_env.GOMP_FALLBACK_ENV}
    if p.tcmalloc and p.iomp5:
        both = f"{p.tcmalloc}:{p.iomp5}"
        out["tcmalloc + Intel OpenMP (default blocktime)"] = {"LD_PRELOAD": both}
        out["tcmalloc + Intel OpenMP, KMP_BLOCKTIME=1 + dist barriers (the launch before issue 32)"] = {
            "LD_PRELOAD": both,
            **runtime_env.IOMP_ENV,
            **runtime_env.IOMP_DIST_BARRIERS,
        }
        out["tcmalloc + Intel OpenMP, KMP_BLOCKTIME=1, default (hyper) barriers"] = {
            "LD_PRELOAD": both,
            **runtime_env.IOMP_ENV,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--adapters", type=int, default=0, help="PEFT adapters mixed into the burst (0 = base)")
    ap.add_argument("--only", default="", help="comma-separated substrings: run only matching variants")
    args = ap.parse_args()
    from benchmarks.lib.real_text import demo_model_dir

    model = demo_model_dir()
    adapters: dict[str, str] = {}
    if args.adapters:
        from benchmarks.lib.peer_adapters import make_adapters

        adapters = make_adapters(model, args.adapters)
    cfg = json.dumps({"model": str(model), "batch": args.batch, "tokens": args.tokens, "adapters": adapters})
    vs = variants()
    if args.only:
        vs = {k: v for k, v in vs.items() if any(s in k for s in args.only.split(","))}
    results: dict[str, list[dict]] = {k: [] for k in vs}
    for r in range(args.rounds):
        order = list(vs) if r % 2 == 0 else list(reversed(vs))
        for name in order:
            env = {**os.environ, "LORAPLEX_FAST_RUNTIME": "0", **vs[name]}
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, cfg], env=env, capture_output=True, text=True, timeout=900
            )
            line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
            if proc.returncode != 0 or not line.startswith("{"):
                print(f"{name}: failed rc={proc.returncode}\n{proc.stderr[-1500:]}", file=sys.stderr)
                continue
            res = json.loads(line)
            results[name].append(res)
            print(f"round {r} {name}: {res}", flush=True)
    print(f"\nbatch {args.batch}, {args.tokens} output tokens, adapters {args.adapters}, medians of {args.rounds}")
    print(f"{'variant':80s} {'tok/s':>7s} {'tok/CPU-s':>9s} {'cores':>5s}")
    for name, rs in results.items():
        if rs:
            med = {k: statistics.median(x[k] for x in rs) for k in ("tok_s", "tok_per_cpu_s", "cores")}
            print(f"{name:80s} {med['tok_s']:7.1f} {med['tok_per_cpu_s']:9.1f} {med['cores']:5.2f}")
    out = RESULTS / "runtime_variants.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))


if __name__ == "__main__":
    main()
