"""bf16 decode steps and prefills on our vdpbf16ps linear kernel (pair panels) vs oneDNN's packed
GEMM, in one engine.

    .venv/bin/python -m loraplex.engine.runtime_env -m benchmarks.engine.bf16_linear [--batches 1,16,64] [--blocks 10]

One ``LLM`` on the demo model (SmolLM2-135M-Instruct, bf16, native CPU backend), loaded with
``LORAPLEX_BF16_LINEAR=pair_panels`` on a CPU with AVX512-BF16. Every projection and the LM
head hold two copies of their weight, the pair panels the engine made at load and oneDNN's blocked
copy made from the same numbers; the benchmark swaps which one the model reads (``KernelOps.linear``
takes either), so the two configurations share the engine, its sequences and the machine's load:

  * ``pair panels``: ``cpu_packed.linear_pair_panels`` (the ``avx512_bf16`` kind's default)
  * ``oneDNN``: ``cpu_packed.linear_bf16`` (the ``amx`` kind's; what ``avx512_bf16`` ran before)

Per batch size: ``batch`` random 128-token prompts (the serve benchmark's length) are prefilled,
then the decode alternates blocks of ``--block-steps`` steps between the two. CPU ms of this
process per step (robust to other load) and wall ms; medians over blocks; the ratio oneDNN ÷
panels (> 1: the panels are faster). Then the prefill: ``batch`` fresh 128-token prompts under each
in turn (order reversed every other round), CPU ms until each has its first token. The two sum
in different orders, so greedy tokens may part at a near-tie: the run reports how many of 8 prompts'
32 greedy tokens agree. JSON: benchmarks/results/bf16_linear.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

from benchmarks.lib.paths import RESULTS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per configuration")
    ap.add_argument("--block-steps", type=int, default=8)
    args = ap.parse_args()

    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM, SamplingParams
    from loraplex.engine.request import EngineRequest
    from loraplex.kernels import cpu_packed, pair_panels

    kind = cpu_packed.cpu_kind()
    if cpu_packed.bf16_linear(kind.name) is None or not cpu_packed.pair_panels_available():
        raise SystemExit(f"this CPU ({kind.name}) cannot run the pair-panel kernel: nothing to compare")
    os.environ["LORAPLEX_BF16_LINEAR"] = "pair_panels"
    batches = [int(b) for b in args.batches.split(",")]
    llm = LLM(str(demo_model_dir()), max_num_seqs=max(batches), seed=0)
    eng = llm.engine
    model = eng.runner.model
    holders = [m for m in model.modules() if pair_panels.is_packed(getattr(m, "packed", None))]
    copies = {
        "pair panels": [m.packed for m in holders] + [model.packed_head],
        "oneDNN": [cpu_packed.pack_bf16(pair_panels.unpack(m.packed)) for m in holders]
        + [cpu_packed.pack_bf16(pair_panels.unpack(model.packed_head))],
    }
    assert all(c is not None for c in copies["oneDNN"]), "oneDNN's bf16 path is not available here"

    def use(name: str) -> None:
        *proj, head = copies[name]
        for m, c in zip(holders, proj, strict=True):
            m.packed = c
        model.packed_head = head

    configs = list(copies)
    rng = random.Random(0)
    steps_needed = 2 * args.blocks * args.block_steps + 4
    sp = SamplingParams(max_tokens=steps_needed + 8, temperature=0.0, ignore_eos=True)
    results = []
    for batch in batches:
        use("pair panels")
        for _ in range(batch):
            eng.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(128)], sp))
        while any(not s.in_decode for s in eng.scheduler.running) or eng.policy.num_waiting():
            eng.step()
        eng.step()
        per: dict[str, dict[str, list[float]]] = {n: {"cpu": [], "wall": []} for n in configs}
        for b in range(args.blocks):
            for name in configs if b % 2 == 0 else configs[::-1]:
                use(name)
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.block_steps):
                    eng.step()
                per[name]["cpu"].append(1e3 * (time.process_time() - c0) / args.block_steps)
                per[name]["wall"].append(1e3 * (time.perf_counter() - t0) / args.block_steps)
        for rid in list(eng.requests):
            eng.abort_request(rid)
        prefill: dict[str, list[float]] = {n: [] for n in configs}
        psp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        for r in range(args.blocks // 2 or 1):
            for name in configs if r % 2 == 0 else configs[::-1]:
                use(name)
                for _ in range(batch):
                    eng.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(128)], psp))
                c0 = time.process_time()
                while any(not s.in_decode for s in eng.scheduler.running) or eng.policy.num_waiting():
                    eng.step()
                prefill[name].append(1e3 * (time.process_time() - c0))
                for rid in list(eng.requests):
                    eng.abort_request(rid)
        row: dict = {"batch": batch}
        for name in configs:
            row[name] = {k: statistics.median(v) for k, v in per[name].items()}
            row[name]["prefill_cpu"] = statistics.median(prefill[name])
        row["oneDNN / panels cpu"] = row["oneDNN"]["cpu"] / row["pair panels"]["cpu"]
        row["oneDNN / panels prefill cpu"] = row["oneDNN"]["prefill_cpu"] / row["pair panels"]["prefill_cpu"]
        results.append(row)
        print(json.dumps(row), flush=True)

    prompts = [[rng.randrange(100, 20000) for _ in range(48)] for _ in range(8)]
    gsp = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    tokens = {}
    for name in configs:
        use(name)
        tokens[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, gsp)]
    use("pair panels")
    agree = sum(len(_common_prefix(a, b)) for a, b in zip(tokens["pair panels"], tokens["oneDNN"], strict=True))
    total = sum(len(t) for t in tokens["oneDNN"])
    print(f"\nCPU: {kind.model}; kind {kind.name}; flags {' '.join(kind.flags)}; threads {torch.get_num_threads()}")
    print(f"load {os.getloadavg()[0]:.2f}; greedy tokens identical before the first difference: {agree} of {total}")
    print("decode: CPU ms per step (wall ms); prefill: CPU ms for the batch's 128-token prompts")
    print(
        f"{'batch':>5s} {'decode panels':>16s} {'oneDNN':>16s} {'ratio':>6s} {'prefill panels':>15s} {'oneDNN':>8s} {'ratio':>6s}"
    )
    for r in results:
        p, o = r["pair panels"], r["oneDNN"]
        print(
            f"{r['batch']:5d} {p['cpu']:7.1f} ({p['wall']:6.1f}) {o['cpu']:7.1f} ({o['wall']:6.1f})"
            f" {r['oneDNN / panels cpu']:6.3f} {p['prefill_cpu']:15.1f} {o['prefill_cpu']:8.1f}"
            f" {r['oneDNN / panels prefill cpu']:6.3f}"
        )
    out = RESULTS / "bf16_linear.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "cpu": kind.name,
                "flags": kind.flags,
                "greedy_agree": [agree, total],
                "rows": results,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


def _common_prefix(a: list[int], b: list[int]) -> list[int]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


if __name__ == "__main__":
    main()
