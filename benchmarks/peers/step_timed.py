"""Where a decode step's time goes, timed op by op at the seams instead of traced.

    .venv/bin/python -m loraplex.engine.runtime_env -m benchmarks.peers.step_timed [--batches 16,64] [--steps 100]

Why a second breakdown: ``step_profile.py`` runs the step under ``torch.profiler``, which records
every operator; at ~400 operators a step its own bookkeeping lands in its "python + dispatch"
remainder (it reported a third of a batch-16 step there). Here every ``KernelOps`` call of the
model (linear, attention, RMSNorm, SiLU x up, rotary, KV write, SGMV), the LM head
(``compute_logits``) and the sampler (``sample_batch``) is wrapped in a ``perf_counter`` pair
(~0.3 µs each, ~300 calls a step), so the groups are the ops' own wall times and the remainder
("python") is everything else in ``LLMEngine.step``: module calls, residual adds, the embedding,
building the batch, scheduling, output processing.

One process under the fast runtime (as ``loraplex serve`` runs), one ``LLM`` on the demo model
(SmolLM2-135M-Instruct, bf16). Per batch size: ``batch`` random 128-token prompts (the serve
benchmark's length) are prefilled, then ``--steps`` pure decode steps are timed (contexts 129 to
128 + steps). ms per step and share of the step; CPU ms per step (process time) beside the wall.

Also measured, the linear op alone: the GEMMs of one decode step (every layer's qkv, o, gate|up,
down plus the head, on the copies the engine makes on this CPU kind: pair panels on
``avx512_bf16``, oneDNN's packed weights on ``amx``; 30 distinct copies per shape, so the weights
come from memory as in a step) at 16, 64 and 512 rows: ms, GB/s of weights read, GFLOP/s. The
512-row rate is the best this machine's bf16 GEMM reaches (a prefill's), the ceiling a decode GEMM
can approach. JSON: benchmarks/results/step_timed.json.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import random
import time
from pathlib import Path

from benchmarks.lib.paths import RESULTS

OPS = {  # KernelOps field: group
    "linear": "layer GEMMs",
    "int8_linear": "layer GEMMs",
    "w8a8_linear": "layer GEMMs",
    "int4_linear": "layer GEMMs",
    "paged_decode_attention": "attention",
    "paged_prefill_attention": "attention",
    "rms_norm": "RMSNorm",
    "silu_mul": "SiLU x up",
    "rotary": "rotary",
    "write_kv": "KV write",
    "sgmv_shrink": "LoRA",
    "sgmv_expand": "LoRA",
}
GROUPS = ("layer GEMMs", "LM head", "attention", "RMSNorm", "SiLU x up", "rotary", "KV write", "LoRA", "sampler")


class Clock:
    """Accumulated wall time per group; ``outer`` suspends the inner ops' accounting (the LM head's
    own linear is the head's, not a layer GEMM)."""

    def __init__(self) -> None:
        self.ms: collections.Counter[str] = collections.Counter()
        self.depth = 0

    def wrap(self, group: str, fn, outer: bool = False):
        def timed(*a, **k):
            if self.depth and not outer:
                return fn(*a, **k)
            self.depth += outer
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.ms[group] += 1e3 * (time.perf_counter() - t0)
                self.depth -= outer

        return timed


def measure(llm, batch: int, steps: int, rng: random.Random) -> dict:
    from loraplex.engine import SamplingParams, model_runner
    from loraplex.engine.request import EngineRequest

    eng = llm.engine
    runner = eng.runner
    clock = Clock()
    plain_ops, plain_sample = runner.ops, model_runner.sample_batch
    runner.ops = dataclasses.replace(plain_ops, **{f: clock.wrap(g, getattr(plain_ops, f)) for f, g in OPS.items()})
    model_runner.sample_batch = clock.wrap("sampler", plain_sample, outer=True)
    runner.model.compute_logits = clock.wrap("LM head", runner.model.compute_logits, outer=True)
    try:
        sp = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
        for _ in range(batch):
            eng.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(128)], sp))
        while any(not s.in_decode for s in eng.scheduler.running) or eng.policy.num_waiting():
            eng.step()
        eng.step()
        clock.ms.clear()
        phases0 = dict(eng.step_seconds)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            eng.step()
        wall = 1e3 * (time.perf_counter() - t0) / steps
        cpu = 1e3 * (time.process_time() - c0) / steps
        phases = {k: 1e3 * (v - phases0.get(k, 0.0)) / steps for k, v in eng.step_seconds.items()}
        for rid in list(eng.requests):
            eng.abort_request(rid)
    finally:
        runner.ops, model_runner.sample_batch = plain_ops, plain_sample
        del runner.model.compute_logits
    groups = {g: clock.ms[g] / steps for g in GROUPS}
    groups["python"] = wall - sum(groups.values())
    # The Python's whereabouts, from the engine's own phase clocks: the forward's (module calls,
    # residual adds, the embedding, building the batch) is the forward phase minus the ops in it.
    in_forward = sum(v for g, v in groups.items() if g not in ("sampler", "python"))
    where = {
        "forward": phases.get("forward", 0.0) - in_forward,
        "sample": phases.get("sample", 0.0) - groups["sampler"],
        "schedule": phases.get("schedule", 0.0),
        "update + outputs": phases.get("update", 0.0),
    }
    where["rest of step"] = groups["python"] - sum(where.values())
    return {"batch": batch, "wall_ms": wall, "cpu_ms": cpu, "ms": groups, "python_ms": where}


def gemm_roofline(rows_list: tuple[int, ...] = (16, 64, 512)) -> list[dict]:
    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.kernels import cpu_packed

    cfg = json.loads((Path(demo_model_dir()) / "config.json").read_text())
    h, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    shapes = {"qkv": (h + 2 * kv, h), "o": (h, h), "gate|up": (2 * inter, h), "down": (h, inter), "head": (vocab, h)}
    # The copies the engine makes on this CPU kind (pair panels or oneDNN's), read by its linear op.
    linear_ops = cpu_packed.CpuLinearOps(cpu_packed.cpu_kind().name)
    copies = {
        name: [
            linear_ops.pack_linear_weight(torch.randn(n, k).bfloat16()) for _ in range(1 if name == "head" else layers)
        ]
        for name, (n, k) in shapes.items()
    }
    if any(w is None for ws in copies.values() for w in ws):
        return []  # a CPU kind that keeps plain bf16 weights: no packed GEMM to measure
    out = []
    for rows in rows_list:
        inputs = {name: torch.randn(rows, k).bfloat16() for name, (_n, k) in shapes.items()}
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for name, x in inputs.items():
                for w in copies[name]:
                    linear_ops.linear(x, None, None, w)
            best = min(best, time.perf_counter() - t0)
        weight_bytes = sum(2 * n * k * len(copies[name]) for name, (n, k) in shapes.items())
        flops = sum(2 * rows * n * k * len(copies[name]) for name, (n, k) in shapes.items())
        out.append({"rows": rows, "ms": 1e3 * best, "gb_s": weight_bytes / best / 1e9, "gflop_s": flops / best / 1e9})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    import os

    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM
    from loraplex.kernels.cpu_packed import cpu_kind

    batches = [int(b) for b in args.batches.split(",")]
    llm = LLM(str(demo_model_dir()), max_num_seqs=max(batches), seed=0)
    rng = random.Random(0)
    rows = [measure(llm, b, args.steps, rng) for b in batches]
    roof = gemm_roofline()
    kind = cpu_kind()
    print(f"CPU: {kind.model}; kind {kind.name}; flags {' '.join(kind.flags)}; threads {torch.get_num_threads()}")
    print(f"load {os.getloadavg()[0]:.2f}; ms per decode step (share of the step's wall time)")
    cols = [*GROUPS, "python"]
    print(f"{'batch':>5s} {'wall':>6s} {'cpu':>6s} " + " ".join(f"{c[:11]:>14s}" for c in cols))
    for r in rows:
        cells = " ".join(f"{r['ms'][c]:6.2f} ({100 * r['ms'][c] / r['wall_ms']:4.1f}%)" for c in cols)
        print(f"{r['batch']:5d} {r['wall_ms']:6.1f} {r['cpu_ms']:6.1f} {cells}")
    print("\nthe python, by engine phase (ms per step):")
    for r in rows:
        print(f"  batch {r['batch']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["python_ms"].items()))
    print("\nGEMMs of one decode step (layers + head, weights from memory):")
    for g in roof:
        print(
            f"  {g['rows']:4d} rows: {g['ms']:7.2f} ms, {g['gb_s']:5.1f} GB/s of weights, {g['gflop_s']:6.1f} GFLOP/s"
        )
    out = RESULTS / "step_timed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cpu = {"model": kind.model, "kind": kind.name, "flags": kind.flags}
    out.write_text(json.dumps({"args": vars(args), "cpu": cpu, "rows": rows, "gemm": roof}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
