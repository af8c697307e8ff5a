"""bf16 decode steps and prefills with the native rotary embedding and KV write vs their torch
twins, in one process.

    .venv/bin/python -m loraplex.engine.runtime_env -m benchmarks.engine.decode_glue [--batches 16,64] [--blocks 10]

One ``LLM`` on the demo model (SmolLM2-135M-Instruct, bf16, native CPU backend). Per batch size:
``batch`` random 128-token prompts (the serve benchmark's length) are prefilled, then the decode
alternates blocks of ``--block-steps`` steps between two ``KernelOps`` of the same engine:

  * ``native``: what the engine runs (``cpu_elementwise.rotary``, ``cpu_elementwise.write_kv``)
  * ``torch twins``: the same ops with ``reference.rotary`` and ``reference.write_kv`` (what it
    ran before: ~7 torch ops per layer for the rotation, ~6 for the KV write)

so both see the same contexts (they grow by one a step) and the same machine load. CPU ms of
this process per step (robust to other load) and wall ms; medians over blocks; the ratio twins ÷
native of CPU time (> 1: native is faster). Then the prefill: ``batch`` fresh 128-token prompts
under each configuration in turn (``--blocks`` / 2 rounds, order reversed every other round), CPU
ms until each has its first token. The native rotary is bit for bit the twin, so the
greedy tokens cannot differ; the run checks that the two produce the same logits on one step.
JSON: benchmarks/results/decode_glue.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import time

from benchmarks.lib.paths import RESULTS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per configuration")
    ap.add_argument("--block-steps", type=int, default=8)
    args = ap.parse_args()

    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM, SamplingParams
    from loraplex.engine.request import EngineRequest
    from loraplex.kernels import reference
    from loraplex.kernels.cpu_packed import cpu_kind

    batches = [int(b) for b in args.batches.split(",")]
    llm = LLM(str(demo_model_dir()), max_num_seqs=max(batches), seed=0)
    eng = llm.engine
    native = eng.runner.ops
    twins = dataclasses.replace(native, rotary=reference.rotary, write_kv=reference.write_kv)
    configs = {"native": native, "torch twins": twins}
    rng = random.Random(0)
    steps_needed = 2 * args.blocks * args.block_steps + 4
    sp = SamplingParams(max_tokens=steps_needed + 8, temperature=0.0, ignore_eos=True)
    results = []
    for batch in batches:
        for _ in range(batch):
            eng.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(128)], sp))
        while any(not s.in_decode for s in eng.scheduler.running) or eng.policy.num_waiting():
            eng.step()
        eng.step()
        per: dict[str, dict[str, list[float]]] = {n: {"cpu": [], "wall": []} for n in configs}
        for b in range(args.blocks):
            order = list(configs) if b % 2 == 0 else list(configs)[::-1]
            for name in order:
                eng.runner.ops = configs[name]
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.block_steps):
                    eng.step()
                per[name]["cpu"].append(1e3 * (time.process_time() - c0) / args.block_steps)
                per[name]["wall"].append(1e3 * (time.perf_counter() - t0) / args.block_steps)
        eng.runner.ops = native
        for rid in list(eng.requests):
            eng.abort_request(rid)
        prefill = _prefill_cpu_ms(eng, configs, batch, args.blocks // 2 or 1, rng)
        row = {"batch": batch}
        for name in configs:
            row[name] = {k: statistics.median(v) for k, v in per[name].items()}
            row[name]["prefill_cpu"] = statistics.median(prefill[name])
        row["twins / native cpu"] = row["torch twins"]["cpu"] / row["native"]["cpu"]
        row["twins / native prefill cpu"] = row["torch twins"]["prefill_cpu"] / row["native"]["prefill_cpu"]
        results.append(row)
        print(json.dumps(row), flush=True)
    same = _same_logits(llm, native, twins, torch)
    kind = cpu_kind()
    print(f"\nCPU: {kind.model}; kind {kind.name}; flags {' '.join(kind.flags)}; threads {torch.get_num_threads()}")
    print(
        f"load {os.getloadavg()[0]:.2f}; the greedy tokens and top-5 logprobs of a prompt identical under both: {same}"
    )
    print("decode: CPU ms per step; prefill: CPU ms for the batch's 128-token prompts")
    print(
        f"{'batch':>5s} {'decode native':>14s} {'twins':>7s} {'ratio':>6s} {'prefill native':>15s} {'twins':>7s} {'ratio':>6s}"
    )
    for r in results:
        n, t = r["native"], r["torch twins"]
        print(
            f"{r['batch']:5d} {n['cpu']:14.1f} {t['cpu']:7.1f} {r['twins / native cpu']:6.3f}"
            f" {n['prefill_cpu']:15.1f} {t['prefill_cpu']:7.1f} {r['twins / native prefill cpu']:6.3f}"
        )
    out = RESULTS / "decode_glue.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cpu": kind.name, "same_logits": same, "rows": results}, indent=2))
    print(f"wrote {out}")


def _prefill_cpu_ms(eng, configs: dict, batch: int, rounds: int, rng: random.Random) -> dict[str, list[float]]:
    """CPU ms to prefill ``batch`` fresh 128-token prompts (steps until each has its first token),
    each configuration in turn, the order reversed every other round."""
    from loraplex.engine import SamplingParams
    from loraplex.engine.request import EngineRequest

    out: dict[str, list[float]] = {n: [] for n in configs}
    sp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    for r in range(rounds):
        for name in list(configs) if r % 2 == 0 else list(configs)[::-1]:
            eng.runner.ops = configs[name]
            for _ in range(batch):
                eng.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(128)], sp))
            c0 = time.process_time()
            while any(not s.in_decode for s in eng.scheduler.running) or eng.policy.num_waiting():
                eng.step()
            out[name].append(1e3 * (time.process_time() - c0))
            for rid in list(eng.requests):
                eng.abort_request(rid)
    eng.runner.ops = configs["native"]
    return out


def _same_logits(llm, native, twins, torch) -> bool:
    """One 24-token prompt, 4 greedy tokens with top-5 logprobs, under each configuration: the same?"""
    from loraplex.engine import SamplingParams

    eng = llm.engine
    outs = []
    for ops in (native, twins):
        eng.runner.ops = ops
        sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=5)
        res = llm.generate([[11 + i for i in range(24)]], sp)[0].outputs[0]
        outs.append((res.token_ids, [(lp.logprob, lp.top) for lp in res.logprobs or [] if lp is not None]))
    eng.runner.ops = native
    del torch
    return outs[0] == outs[1]


if __name__ == "__main__":
    main()
