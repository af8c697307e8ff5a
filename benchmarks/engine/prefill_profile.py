"""Where a prefill burst's time goes on this CPU: the steps that admit ``batch`` prompts at once.

    .venv/bin/python -m benchmarks.engine.prefill_profile [--batches 16,64] [--prompt 128] [--rounds 2]
        [--chunk 2048] [--with-decodes 0]

One ``LLM`` on the demo model (SmolLM2-135M-Instruct) in bf16 on the native CPU backend (packed
weights where this CPU kind packs). Per batch size and round: ``batch`` prompts of ``--prompt``
tokens are admitted at once (``--with-decodes N``: beside N sequences already decoding, as at a
server's steady state) and the steps until each has its first token run under ``torch.profiler``
(``benchmarks/peers/step_profile.py``'s grouping: GEMM, lm head, attention, kv write, sampler,
element-wise, python + dispatch; the groups add up to the steps' CPU time). ``--chunk`` is
``max_num_batched_tokens`` (tokens per step). Prints ms per burst by group, medians of rounds,
with the CPU model, flags and load; JSON: benchmarks/results/prefill_profile.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics

from benchmarks.lib.cpu_result import write_cpu_result
from benchmarks.peers.step_profile import GROUPS, _wrapped, profile_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--with-decodes", type=int, default=0)
    args = ap.parse_args()
    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM, SamplingParams
    from loraplex.engine.request import EngineRequest
    from loraplex.kernels import cpu_packed

    torch.set_num_threads(args.threads)
    kind = cpu_packed.cpu_kind()
    print(f"CPU: {kind.model} | kind {kind.name} | flags {' '.join(kind.flags)} | load {os.getloadavg()}")
    batches = [int(b) for b in args.batches.split(",")]
    llm = LLM(
        str(demo_model_dir()), dtype="bfloat16", kernel_backend="cpu", max_num_seqs=max(batches) + args.with_decodes,
        max_num_batched_tokens=args.chunk, enable_prefix_caching=False, seed=0,
    )  # fmt: skip
    engine = llm.engine
    engine.runner.ops = _wrapped(engine.runner.ops)
    sp = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    res: dict[int, list[dict]] = {}
    for r in range(args.rounds):
        for b in batches:
            rng = random.Random(1000 * r + b)
            for _ in range(args.with_decodes):
                engine.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(16)], sp))
            while any(not s.in_decode for s in engine.scheduler.running) or engine.policy.num_waiting():
                engine.step()
            new = [EngineRequest([rng.randrange(100, 20000) for _ in range(args.prompt)], sp) for _ in range(b)]
            for req in new:
                engine.add_request(req)
            steps = 0
            while any(not s.in_decode for s in engine.scheduler.running) or engine.policy.num_waiting():
                engine.step()  # count the steps the burst takes (then profile the same number again)
                steps += 1
            for rid in list(engine.requests):
                engine.abort_request(rid)
            for _ in range(args.with_decodes):
                engine.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(16)], sp))
            while any(not s.in_decode for s in engine.scheduler.running) or engine.policy.num_waiting():
                engine.step()
            for _ in range(b):
                engine.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(args.prompt)], sp))
            prof = profile_steps(llm, steps)
            for rid in list(engine.requests):
                engine.abort_request(rid)
            burst = {k: v * steps for k, v in prof.items() if k != "top elementwise"}
            burst["steps"] = steps
            burst["top elementwise"] = {k: v * steps for k, v in prof["top elementwise"].items()}  # type: ignore[union-attr]
            res.setdefault(b, []).append(burst)
            print(
                f"round {r} b{b}: {steps} steps, {burst['step cpu']:.0f} CPU ms, {burst['step wall']:.0f} wall ms",
                flush=True,
            )
    table = []
    cols = (*GROUPS, "step cpu", "step wall")
    print(f"\nms per burst of prompts (medians of {args.rounds}); {args.threads} thread(s); load now {os.getloadavg()}")
    print(f"{'batch':>5} {'steps':>5} " + " ".join(f"{c[:12]:>12}" for c in cols))
    for b, rows in res.items():
        med = {c: statistics.median(x[c] for x in rows) for c in cols}
        print(f"{b:5d} {rows[0]['steps']:5d} " + " ".join(f"{med[c]:12.0f}" for c in cols))
        print("      top element-wise: " + ", ".join(f"{k} {v:.0f}" for k, v in rows[-1]["top elementwise"].items()))
        table.append({"batch": b, "steps": rows[0]["steps"], **med, "top_elementwise": rows[-1]["top elementwise"]})
    out = write_cpu_result("prefill_profile", {"args": vars(args)}, table=table)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
