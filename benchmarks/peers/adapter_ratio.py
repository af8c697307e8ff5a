"""Inside loraplex: decode throughput with many adapters mixed in a batch, divided by the base model's.

    .venv/bin/python -m benchmarks.peers.adapter_ratio [--batch 64] [--adapters 8,64] [--rounds 3] [--threads 1]

One process, one ``LLM`` on the demo model (SmolLM2-135M-Instruct) with every adapter registered
(``benchmarks/lib/peer_adapters.py``: rank 16 on all seven linear layers; ``max_loras`` = the largest count, so a
step can hold them all). Each round runs the same burst (``--batch`` random 16-token prompts,
``--tokens`` output tokens, ignore_eos) as: base only, then N adapters round-robin over the rows,
with the grouped native SGMV (``sgmv=native``) and with the torch gather path (``sgmv=torch``, the
previous serving path) — alternating, the order reversed every round. Reported: medians of output
tokens per CPU-second of this process (robust to other load) and wall tok/s, and the ratio to base.

Adapter storage: the model's dtype (bf16 on a CPU with native bf16, where ``dtype="auto"`` packs the
base linears; else float32) and float16. ``--baseline REF`` adds the same N-adapter runs on the
kernel library built with ``kernels/csrc/cpu_sgmv.cpp`` as of git REF (A/B of an SGMV change in
one process). The JSON (``benchmarks/results/adapter_ratio.json``) records the CPU, its flags and
the load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import resource
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--adapters", default="8,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--torch-sgmv", action="store_true", help="also the torch gather path (slow)")
    ap.add_argument("--baseline", default="", help="git ref of an older cpu_sgmv.cpp to compare with")
    ap.add_argument("--no-fp16", action="store_true", help="skip the float16-storage runs")
    args = ap.parse_args()
    from benchmarks.lib.cpu_result import write_cpu_result
    from benchmarks.lib.peer_adapters import RANK, make_adapters
    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM, SamplingParams
    from loraplex.kernels import cpu_native, reference

    counts = [int(c) for c in args.adapters.split(",") if c]
    model = demo_model_dir()
    ads = make_adapters(model, max(counts))
    llm = LLM(
        str(model), max_num_seqs=args.batch, max_loras=max(counts), max_cpu_loras=max(counts),
        max_lora_rank=RANK, seed=0, lora_dtype="model",
    )  # fmt: skip
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    for n, p in ads.items():
        llm.add_adapter(n, p)
    runner = llm.engine.runner
    native_ops = runner.ops
    torch_ops = dataclasses.replace(native_ops, sgmv_shrink=reference.sgmv_shrink, sgmv_expand=reference.sgmv_expand)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 20000) for _ in range(16)] for _ in range(args.batch)]
    sp = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    names = sorted(ads)
    # Every adapter resident (max_loras = the largest count), then the host cache is not needed.
    llm.generate(
        prompts,
        SamplingParams(max_tokens=1, ignore_eos=True),
        adapters=[names[i % len(names)] for i in range(args.batch)],
    )
    llm.engine.lora.host.clear()
    projs = [p for ps in runner.model.lora_projections().values() for p in ps if p.lora_a is not None]
    new_lib = cpu_native._lib
    libs = {"new": new_lib}
    if args.baseline:
        from benchmarks.kernels.cpu_sgmv import build_baseline

        libs["old"] = build_baseline(args.baseline)
    mdt = projs[0].lora_a.dtype
    short = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    configs: list[tuple[str, int, object, torch.dtype, str]] = [("base", 0, native_ops, mdt, "new")]
    for c in counts:
        for storage in [mdt] if args.no_fp16 or mdt == torch.float16 else [mdt, torch.float16]:
            configs.append((f"{c} adapters, native {short[storage]}", c, native_ops, storage, "new"))
            if args.baseline:
                configs.append((f"{c} adapters, old {short[storage]}", c, native_ops, storage, "old"))
        if args.torch_sgmv:
            configs.append((f"{c} adapters, sgmv=torch", c, torch_ops, mdt, "new"))
    copies = {mdt: [(p.lora_a, p.lora_b) for p in projs]}
    if not args.no_fp16:
        copies[torch.float16] = [(a.half(), b.half()) for a, b in copies[mdt]]
    res: dict[str, list[tuple[float, float]]] = {c[0]: [] for c in configs}
    for r in range(-1, args.rounds):  # round -1: a short untimed warm-up of every configuration
        for label, n, ops, storage, lib in configs if r % 2 == 0 else list(reversed(configs)):
            runner.ops = ops
            cpu_native._lib = libs[lib]
            for p, (a, b) in zip(projs, copies[storage]):
                p.lora_a, p.lora_b = a, b
            adapters = [names[i % n] if n else None for i in range(args.batch)]
            if r < 0:
                llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True), adapters=adapters)
                continue
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            outs = llm.generate(prompts, sp, adapters=adapters)
            wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            toks = sum(len(o.outputs[0].token_ids) for o in outs)
            res[label].append((toks / cpu, toks / wall))
            print(f"round {r} {label:26s} {toks / cpu:7.1f} tok/CPU-s {toks / wall:7.1f} tok/s", flush=True)
    runner.ops = native_ops
    cpu_native._lib = new_lib
    base_cpu = statistics.median(x[0] for x in res["base"])
    base_wall = statistics.median(x[1] for x in res["base"])
    print(f"\nbatch {args.batch}, {args.tokens} tokens, medians of {args.rounds} alternating rounds")
    print(f"{'config':26s} {'tok/CPU-s':>9s} {'÷ base':>6s} {'tok/s':>7s} {'÷ base':>6s}")
    rows = []
    for label, *_ in configs:
        c = statistics.median(x[0] for x in res[label])
        w = statistics.median(x[1] for x in res[label])
        print(f"{label:26s} {c:9.1f} {c / base_cpu:6.2f} {w:7.1f} {w / base_wall:6.2f}")
        rows.append(
            {"config": label, "tok_cpu_s": c, "ratio_cpu": c / base_cpu, "tok_s": w, "ratio_wall": w / base_wall}
        )
        rows[-1]["rounds"] = res[label]
    print(f"threads {torch.get_num_threads()}; load average {os.getloadavg()}; model dtype {mdt}")
    meta = {"args": vars(args), "threads": torch.get_num_threads(), "model_dtype": str(mdt)}
    print(f"-> {write_cpu_result('adapter_ratio', meta, rows=rows)}")


if __name__ == "__main__":
    main()
