"""Prompt-sized LoRA groups on the vdpbf16ps tiles vs the per-token SGMV loops, in one engine.

    .venv/bin/python -m loraplex.engine.runtime_env -m benchmarks.engine.sgmv_prompt_groups [--rows 8x16,64x64] [--rounds 3]

Both are ``cpu_sgmv.sgmv_shrink`` / ``sgmv_expand`` for bf16 activations and adapters: ``tiles``
(the default where the build has AVX512-BF16: a group of >= 16 consecutive tokens of one adapter,
i.e. a prompt chunk, runs as two small GEMMs on pair panels) and ``per-token`` (``prompt_groups=
False``: what ran before, and what the batch-invariant ops keep). Decode groups (1-4 tokens) take
the per-token loops in both.

One LLM on the demo model (bf16) with the serve benchmark's 64 rank-16 PEFT adapters on every
linear layer (``benchmarks/lib/peer_adapters.py``), all resident (``max_loras`` 64). Per row
"NxC": C clients, requests round-robin over N adapters, serving-shaped traffic
(``benchmarks/lib/serve_shaped.py``: 128-token prompts, 64 tokens each, 2 x C requests); the SGMV
swapped between runs, order reversed every round, prompts new every run. Output tok/s (wall), per
CPU-second, and the mean wall of a step that carried prompt tokens. CPU model and flags with the
table. JSON: benchmarks/results/sgmv_prompt_groups.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os

from benchmarks.lib.paths import RESULTS
from benchmarks.lib.serve_shaped import alternating, serve_shaped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="8x16,64x64", help="ADAPTERSxCLIENTS,...")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch

    from benchmarks.lib.peer_adapters import RANK, make_adapters
    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM
    from loraplex.kernels import cpu_sgmv
    from loraplex.kernels.cpu_packed import cpu_kind

    kind = cpu_kind()
    print(f"CPU: {kind.model}; kind {kind.name}; flags {' '.join(kind.flags)}; threads {torch.get_num_threads()}")
    if not cpu_sgmv.prompt_groups_available():
        print("this build has no AVX512-BF16 prompt-group tiles: nothing to compare")
        return
    rows = [tuple(int(v) for v in r.split("x")) for r in args.rows.split(",")]
    model = demo_model_dir()
    ads = make_adapters(model, max(n for n, _ in rows))
    llm = LLM(
        str(model), max_num_seqs=max(c for _, c in rows), max_loras=len(ads), max_cpu_loras=len(ads),
        max_lora_rank=RANK, seed=0,
    )  # fmt: skip
    for name, path in ads.items():
        llm.add_adapter(name, path)
    names = sorted(ads)
    plain = llm.engine.runner.ops
    variants = {
        "tiles": plain,
        "per-token": dataclasses.replace(
            plain,
            sgmv_shrink=functools.partial(plain.sgmv_shrink, prompt_groups=False),
            sgmv_expand=functools.partial(plain.sgmv_expand, prompt_groups=False),
        ),
    }
    serve_shaped(llm, len(names), plain, seed=-1, adapters=names)  # warm-up: every adapter resident
    results = []
    for n_adapters, conc in rows:
        row: dict = {
            "adapters": n_adapters,
            "concurrency": conc,
            **alternating(llm, variants, conc, args.rounds, seed=10 * conc + n_adapters, adapters=names[:n_adapters]),
        }
        row["tiles_over_per_token_tok_s"] = row["tiles"]["tok_s"] / row["per-token"]["tok_s"]
        results.append(row)
    llm.engine.runner.ops = plain
    print(f"\nmedians of {args.rounds} alternating rounds; load {os.getloadavg()[0]:.2f}")
    print(
        f"{'adapters x clients':>18s} {'SGMV':>10s} {'tok/s':>7s} {'tok/CPU-s':>9s} {'prompt step ms':>14s}  rounds tok/s"
    )
    for row in results:
        for name in variants:
            r = row[name]
            rounds = " / ".join(f"{v:.1f}" for v in r["per_round_tok_s"])
            label = f"{row['adapters']} x {row['concurrency']}"
            print(
                f"{label:>18s} {name:>10s} {r['tok_s']:7.1f} {r['tok_per_cpu_s']:9.1f} {r['prompt_step_ms']:14.1f}  {rounds}"
            )
        print(f"{'':18s} tiles / per-token tok/s {row['tiles_over_per_token_tok_s']:.3f}")
    out = RESULTS / "sgmv_prompt_groups.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cpu = {"model": kind.model, "kind": kind.name, "flags": kind.flags}
    out.write_text(json.dumps({"args": vars(args), "cpu": cpu, "rows": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
