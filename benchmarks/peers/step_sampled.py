"""Where a decode step's time goes, sampled from outside the process instead of traced inside it.

    .venv/bin/python -m benchmarks.peers.step_sampled [--batches 16,64] [--steps 120] [--rate 100]

Why a second profile: ``step_profile.py`` runs the step under ``torch.profiler``, which records
every operator; at ~400 operators a step its own bookkeeping lands in the "python + dispatch"
remainder (it reported a third of a batch-16 step there). py-spy reads the interpreter's stack
from another process (``--nonblocking``: the engine is never paused), so what it costs is not in
the step.

Per batch size, a child process under the fast runtime (tcmalloc + Intel OpenMP, as ``loraplex
serve`` runs) builds an ``LLM`` on the demo model (SmolLM2-135M-Instruct, bf16), prefills
``batch`` random 128-token prompts (the serve benchmark's length) and runs ``--steps`` pure decode
steps (contexts 129 to 128 + steps) while py-spy samples it. A sample inside the timed loop is
filed by the innermost engine or kernel function on its stack: a native kernel's wrapper keeps
its samples while the kernel runs (ctypes and torch release the GIL but py-spy still sees the
calling line), so each group is kernel + its Python wrapper. Groups: the packed bf16 GEMMs of the
layers, the LM head, attention, RMSNorm, SiLU x up, rotary, KV write, the sampler, and "model glue"
(everything else inside the step: residual adds, module calls, batch building, scheduling, output
processing). The child reports wall and CPU ms per step.

Also measured here, torch alone: the GEMMs of one decode step (every layer's qkv, o, gate|up, down
plus the head, through the same oneDNN packed weights; 30 distinct copies per shape so weights
come from memory as in a step) at 16, 64 and 512 rows: ms, GB/s of weights read, GFLOP/s. The
512-row rate is the best this machine's bf16 GEMM reaches (the prefill's), the ceiling a decode
GEMM can approach. JSON: benchmarks/results/step_sampled.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.paths import RESULTS, ROOT

GROUPS = {  # group: function names (py-spy frame "function (file:line)"), matched innermost first
    "LM head": ("compute_logits",),
    "sampler": ("sample_batch", "process_logits", "ModelRunner._sample"),
    "attention": ("paged_decode_attention", "paged_prefill_attention"),
    "RMSNorm": ("rms_norm", "RMSNorm.forward"),
    "SiLU x up": ("silu_mul",),
    "rotary": ("_rotate", "RotaryEmbedding.rotate", "RotaryEmbedding.tables"),
    "KV write": ("write_kv",),
    "layer GEMMs": ("linear_bf16", "CpuLinearOps.linear"),
}
OUTER_FIRST = ("LM head", "sampler")  # anywhere on the stack: their GEMM / element-wise ops are theirs
LOOP_MARK = "step_sampled.py"


def _child(batch: int, steps: int) -> None:
    """The profiled process: prefill, then ``steps`` decode steps inside ``_decode_loop``."""
    import random

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.engine import LLM, SamplingParams
    from loraplex.engine.request import EngineRequest

    llm = LLM(str(demo_model_dir()), max_num_seqs=max(batch, 16), seed=0)
    eng = llm.engine
    rng = random.Random(batch)
    sp = SamplingParams(max_tokens=steps + 16, temperature=0.0, ignore_eos=True)
    for _ in range(batch):
        eng.add_request(EngineRequest([rng.randrange(100, 20000) for _ in range(128)], sp))
    while any(not s.in_decode for s in eng.scheduler.running) or eng.policy.num_waiting():
        eng.step()
    wall, cpu = _decode_loop(eng, steps)
    print(json.dumps({"wall_ms": 1e3 * wall / steps, "cpu_ms": 1e3 * cpu / steps}), flush=True)


def _decode_loop(eng, steps: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        eng.step()
    return time.perf_counter() - t0, time.process_time() - c0


def _group(frames: list[str]) -> str:
    names = [f.split(" (")[0] for f in frames]
    for g in OUTER_FIRST:
        if any(n in GROUPS[g] for n in names):
            return g
    for n in reversed(names):
        for g, fns in GROUPS.items():
            if g not in OUTER_FIRST and n in fns:
                return g
    return "model glue"


def sample(batch: int, steps: int, rate: int) -> dict:
    from loraplex.engine import runtime_env

    plan = runtime_env.plan()
    env = {**os.environ, "LD_PRELOAD": ":".join(plan.preload), **plan.env, runtime_env.MARK_ENV: ""}
    env["PYTHONPATH"] = str(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        cmd = [
            str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking", "-r", str(rate), "-f", "raw",
            "-o", str(raw), "--", sys.executable, "-m", "benchmarks.peers.step_sampled",
            "--child", f"{batch}:{steps}",
        ]  # fmt: skip
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=ROOT).stdout
        timing = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
        counts: collections.Counter[str] = collections.Counter()
        for line in raw.read_text().splitlines():
            stack, n = line.rsplit(" ", 1)
            frames = stack.split(";")
            if any("_decode_loop" in f and LOOP_MARK in f for f in frames):
                counts[_group(frames)] += int(n)
    total = sum(counts.values())
    shares = {g: counts[g] / total for g in [*GROUPS, "model glue"]}
    return {"batch": batch, "samples": total, **timing, "shares": shares}


def gemm_roofline(rows_list: tuple[int, ...] = (16, 64, 512)) -> list[dict]:
    import torch

    from benchmarks.lib.real_text import demo_model_dir
    from loraplex.kernels import cpu_packed

    cfg = json.loads((Path(demo_model_dir()) / "config.json").read_text())
    h, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    q, kv = h, d * cfg["num_key_value_heads"]
    shapes = {"qkv": (q + 2 * kv, h), "o": (h, q), "gate|up": (2 * inter, h), "down": (h, inter)}
    copies = {
        name: [cpu_packed.pack_bf16(torch.randn(n, k).bfloat16()) for _ in range(layers)]
        for name, (n, k) in shapes.items()
    }
    head = [cpu_packed.pack_bf16(torch.randn(vocab, h).bfloat16())]
    if any(w is None for ws in copies.values() for w in ws):
        return []  # a CPU kind that keeps plain bf16 weights: no packed GEMM to measure
    out = []
    for rows in rows_list:
        weight_bytes = flops = 0.0
        best = float("inf")
        inputs = {name: torch.randn(rows, k).bfloat16() for name, (_n, k) in [*shapes.items(), ("head", (vocab, h))]}
        for _ in range(3):
            t0 = time.perf_counter()
            for name, x in inputs.items():
                for w in copies.get(name, head):
                    cpu_packed.linear_bf16(x, w, None)
            best = min(best, time.perf_counter() - t0)
        for name, (n, k) in [*shapes.items(), ("head", (vocab, h))]:
            count = 1 if name == "head" else layers
            weight_bytes += 2 * n * k * count
            flops += 2 * rows * n * k * count
        out.append({"rows": rows, "ms": 1e3 * best, "gb_s": weight_bytes / best / 1e9, "gflop_s": flops / best / 1e9})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        b, s = args.child.split(":")
        _child(int(b), int(s))
        return
    from loraplex.kernels.cpu_packed import cpu_kind

    rows = [sample(int(b), args.steps, args.rate) for b in args.batches.split(",")]
    roof = gemm_roofline()
    kind = cpu_kind()
    print(f"CPU: {kind.model}; kind {kind.name}; flags {' '.join(kind.flags)}")
    cols = [*GROUPS, "model glue"]
    print(
        f"{'batch':>5s} {'wall ms':>8s} {'cpu ms':>7s} " + " ".join(f"{c[:11]:>11s}" for c in cols) + "  (% of samples)"
    )
    for r in rows:
        print(
            f"{r['batch']:5d} {r['wall_ms']:8.1f} {r['cpu_ms']:7.1f} "
            + " ".join(f"{100 * r['shares'][c]:11.1f}" for c in cols)
        )
    print("\nGEMMs of one decode step (layers + head, weights from memory):")
    for g in roof:
        print(
            f"  {g['rows']:4d} rows: {g['ms']:7.2f} ms, {g['gb_s']:5.1f} GB/s of weights, {g['gflop_s']:6.1f} GFLOP/s"
        )
    out = RESULTS / "step_sampled.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "cpu": {"model": kind.model, "kind": kind.name, "flags": kind.flags},
                "rows": rows,
                "gemm": roof,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
