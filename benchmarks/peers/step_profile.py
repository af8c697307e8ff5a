"""Where one decode step goes: a per-op breakdown at batch 16 / 64, base model vs many adapters.

    .venv/bin/python -m benchmarks.peers.step_profile [--batches 16,64] [--adapters 0,64] [--steps 8]

One process, one ``LLM`` on the demo model (SmolLM2-135M-Instruct, bf16, the fast runtime) with
``--adapters`` rank-16 PEFT adapters registered (``benchmarks/lib/peer_adapters.py``: all seven linear layers).
For each (batch, adapters) configuration: ``batch`` requests with 16-token prompts are prefilled,
then ``--steps`` pure decode steps run under ``torch.profiler`` (alternating configurations, the
order reversed every round). The kernel ops that are not torch operators (the native attention and
SGMV behind ctypes) are wrapped in ``record_function`` so they show up by name. Per step, medians
over rounds, self time of the calling thread (the ops are synchronous; intra-op threads work
inside them) scaled by the step's process CPU time / wall time (on a shared machine the process is
descheduled at random moments, which inflates every group alike), so the groups add up to the
step's CPU time (exactly so with ``--threads 1``), grouped:

  * ``base GEMM``: ``aten::mm`` / ``addmm`` / ``linear`` of the decoder layers, or the native
    packed bf16 linear (``loraplex::cpu_linear``) where the weights are bf16-exact
  * ``lm head``: the output projection (vocab x hidden), one per step
  * ``lora shrink`` / ``lora expand``: the SGMV ops (all layers)
  * ``attention``, ``kv write``: the paged ops
  * ``sampler``: everything under ``sample_batch``
  * ``elementwise``: RMSNorm, rotary, SiLU x up, residual adds, casts, cat/index
  * ``python + dispatch``: step wall time not inside any operator (scheduling, tensor building,
    module calls)

Also printed: the bytes a step must read (base weights + the distinct adapters' A and B) and the
bandwidth of a large copy measured in this process, i.e. how long a perfectly memory-bound step
would take. JSON: benchmarks/results/step_profile.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time

from benchmarks.lib.paths import RESULTS

GROUPS = (
    "base GEMM",
    "lm head",
    "lora shrink",
    "lora expand",
    "attention",
    "kv write",
    "sampler",
    "elementwise",
    "python + dispatch",
)


def _wrapped(ops):
    """The same KernelOps with each op inside a named ``record_function`` (ctypes calls are
    invisible to the profiler otherwise)."""
    from torch.profiler import record_function

    def wrap(name, fn):
        def inner(*a, **k):
            with record_function(f"lp::{name}"):
                return fn(*a, **k)

        return inner

    fields = ("write_kv", "paged_decode_attention", "paged_prefill_attention", "sgmv_shrink", "sgmv_expand")
    return dataclasses.replace(ops, **{f: wrap(f, getattr(ops, f)) for f in fields})


def _group(name: str) -> str | None:
    if "sgmv_shrink" in name:  # lp::sgmv_shrink and the kernel's own loraplex::cpu_sgmv_shrink inside it
        return "lora shrink"
    if "sgmv_expand" in name:
        return "lora expand"
    if "attention" in name:
        return "attention"
    if "write_kv" in name:
        return "kv write"
    if name == "loraplex::cpu_linear":  # the packed bf16 linear (kernels/csrc/cpu_linear.cpp)
        return "base GEMM"
    if name in ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "mkldnn::_linear_pointwise"):
        return "base GEMM"
    return "elementwise"


def profile_steps(llm, steps: int) -> dict[str, float]:
    """Run ``steps`` engine steps under the profiler; ms per step by group."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from loraplex.engine import model_runner

    engine = llm.engine
    runner = engine.runner
    sample_batch = model_runner.sample_batch
    compute_logits = runner.model.compute_logits

    def timed_sample(*a, **k):
        with record_function("lp::sampler"):
            return sample_batch(*a, **k)

    def timed_logits(*a, **k):
        with record_function("lp::lm_head"):
            return compute_logits(*a, **k)

    model_runner.sample_batch = timed_sample
    runner.model.compute_logits = timed_logits
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                engine.step()
        wall_ms = 1e3 * (time.perf_counter() - t0) / steps
        cpu_ms = 1e3 * (time.process_time() - c0) / steps
    finally:
        model_runner.sample_batch = sample_batch
        del runner.model.compute_logits
    # Self time per event; events nested under lp::sampler / lp::lm_head belong to those groups.
    out = dict.fromkeys(GROUPS, 0.0)
    events = prof.events()
    spans = {
        g: [(e.time_range.start, e.time_range.end) for e in events if e.name == f"lp::{tag}"]
        for g, tag in (("sampler", "sampler"), ("lm head", "lm_head"))
    }

    def inside(e, g):
        return any(s <= e.time_range.start and e.time_range.end <= t for s, t in spans[g])

    op_total = 0.0
    for e in events:
        if e.name.startswith("lp::sampler") or e.name.startswith("lp::lm_head") or e.name.startswith("ProfilerStep"):
            continue
        self_us = e.self_cpu_time_total
        op_total += self_us
        g = "sampler" if inside(e, "sampler") else "lm head" if inside(e, "lm head") else _group(e.name)
        out[g] += self_us / 1e3 / steps
    del torch
    out["python + dispatch"] = max(0.0, wall_ms - op_total / 1e3 / steps)
    # On a shared machine the process is descheduled at random moments: every group's wall time is
    # inflated by about the same factor. Scaled by CPU / wall, the groups add up to the step's CPU.
    scale = min(1.0, cpu_ms / wall_ms)
    out = {k: v * scale for k, v in out.items()}
    out["step cpu"] = cpu_ms
    out["step wall"] = wall_ms
    # The heaviest operators outside the named groups (what "elementwise" is made of).
    other: dict[str, float] = {}
    for e in events:
        if _group(e.name) == "elementwise" and not (inside(e, "sampler") or inside(e, "lm head")):
            other[e.name] = other.get(e.name, 0.0) + e.self_cpu_time_total * scale / 1e3 / steps
    out["top elementwise"] = dict(sorted(other.items(), key=lambda kv: -kv[1])[:6])  # type: ignore[assignment]
    return out


def step_bytes(llm, n_adapters: int, rank: int) -> tuple[float, float]:
    """(base weight bytes a decode step reads, LoRA A+B bytes of ``n_adapters`` distinct adapters)."""
    model = llm.engine.runner.model
    base = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    base += model.output_weight().numel() * model.output_weight().element_size()  # the (tied) head
    # bf16 weights packed for oneDNN replace the plain parameter (kernels/cpu_packed.py): same bytes.
    base += sum(p.packed.numel() * 2 for ps in model.lora_projections().values() for p in ps if p.weight is None)
    lora = 0
    for projs in model.lora_projections().values():
        for p in projs:
            n_slices = len(p.slice_sizes)
            lora += (n_slices * rank * p.in_features + rank * p.slice_offsets[-1]) * 2  # bf16
    return float(base), float(lora * n_adapters)


def copy_bandwidth() -> float:
    """GB/s of a 256 MB tensor copy (read + write counted), best of 5."""
    import torch

    src = torch.empty(64 << 20, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--adapters", default="0,64")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (0: torch's default); 1 on a crowded machine, where"
        " every OpenMP barrier otherwise waits for a descheduled partner thread",
    )
    args = ap.parse_args()
    from benchmarks.lib.peer_adapters import RANK, make_adapters
    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM, SamplingParams
    from loraplex.engine.request import EngineRequest

    batches = [int(b) for b in args.batches.split(",")]
    counts = [int(c) for c in args.adapters.split(",")]
    model = demo_model_dir()
    top = max(max(counts), 1)
    ads = make_adapters(model, top)
    llm = LLM(
        str(model), max_num_seqs=max(batches), max_loras=top, max_cpu_loras=top, max_lora_rank=RANK, seed=0,
    )  # fmt: skip
    for n, p in ads.items():
        llm.add_adapter(n, p)
    names = sorted(ads)
    engine = llm.engine
    engine.runner.ops = _wrapped(engine.runner.ops)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    rng = random.Random(0)
    sp = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    configs = [(b, c) for b in batches for c in counts]
    results: dict[str, list[dict]] = {f"b{b}-a{c}": [] for b, c in configs}
    llm.generate([[rng.randrange(100, 20000) for _ in range(16)]] * 2, SamplingParams(max_tokens=2))  # warm-up
    for r in range(args.rounds):
        for b, c in configs if r % 2 == 0 else configs[::-1]:
            for i in range(b):
                prompt = [rng.randrange(100, 20000) for _ in range(16)]
                engine.add_request(EngineRequest(prompt, sp, adapter=names[i % c] if c else None))
            while any(not s.in_decode for s in engine.scheduler.running) or engine.policy.num_waiting():
                engine.step()  # prefills (and the first decodes) outside the profile
            engine.step()
            res = profile_steps(llm, args.steps)
            for rid in list(engine.requests):
                engine.abort_request(rid)
            results[f"b{b}-a{c}"].append(res)
            print(
                f"round {r} batch {b} adapters {c}: "
                + json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}),
                flush=True,
            )
    bw = copy_bandwidth()
    print(
        f"\nms per decode step, medians of {args.rounds} rounds x {args.steps} steps; threads {torch.get_num_threads()}; copy bandwidth {bw:.1f} GB/s"
    )
    keys = [*GROUPS, "step cpu", "step wall"]
    print(f"{'config':10s} " + " ".join(f"{k[:12]:>12s}" for k in keys) + f" {'bytes MB':>9s} {'mem-bound ms':>12s}")
    table = []
    for b, c in configs:
        med = {k: statistics.median(x[k] for x in results[f"b{b}-a{c}"]) for k in keys}
        base_b, lora_b = step_bytes(llm, min(c, b), RANK)
        row = {"batch": b, "adapters": c, **med, "bytes_mb": (base_b + lora_b) / 1e6}
        row["memory_bound_ms"] = 1e3 * (base_b + lora_b) / (bw / 2 * 1e9)  # a copy's GB/s counts read + write
        table.append(row)
        print(
            f"b{b}-a{c:<6d} "
            + " ".join(f"{med[k]:12.2f}" for k in keys)
            + f" {row['bytes_mb']:9.1f} {row['memory_bound_ms']:12.2f}"
        )
    out = RESULTS / "step_profile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "copy_gb_s": bw, "table": table, "raw": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
