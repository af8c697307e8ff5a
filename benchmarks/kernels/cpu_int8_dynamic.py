"""INT8 weights and activations through torch's oneDNN ops vs the packed bf16 linear (issue 33, item 4).

    .venv/bin/python -m benchmarks.kernels.cpu_int8_dynamic [--rows 1,16,64,256] [--rounds 3]

A feasibility measurement, not an engine path yet: per-output-channel symmetric int8 weights
prepacked once (``torch.ops.onednn.qlinear_prepack``), activations quantized per call to uint8 with
one scale and zero point per tensor (in torch ops: min, max, round, clamp), multiplied by
``torch.ops.onednn.qlinear_pointwise`` (AMX-INT8 / VNNI where the CPU has them) with a bf16 output.
Against ``cpu_packed.linear_bf16`` on the same weights, SmolLM2's gate/up shape (576 -> 3072), 16
distinct weights cycled; one thread, CPU time, the best of ``--rounds``. Also the relative error of
the int8 product against the bf16 one. Prints the CPU kind and flags; JSON:
benchmarks/results/cpu_int8_dynamic.json.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from benchmarks.lib.cpu_result import write_cpu_result
from loraplex.kernels import cpu_packed


def _time(fn, reps: int) -> float:
    fn()
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,16,64,256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=576)
    ap.add_argument("--n", type=int, default=3072)
    args = ap.parse_args()
    torch.set_num_threads(1)
    kind = cpu_packed.cpu_kind()
    print(f"CPU: {kind.model} | kind {kind.name} | flags {' '.join(kind.flags)} | load {os.getloadavg()}")
    if not hasattr(torch.ops.onednn, "qlinear_pointwise") or cpu_packed.pack_bf16(torch.ones(2, 2).bfloat16()) is None:
        raise SystemExit("this torch / CPU kind has no oneDNN int8 linear or no packed bf16 path to compare with")
    k, n, count = args.k, args.n, 16
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g).to(torch.bfloat16) for _ in range(count)]
    packed = [cpu_packed.pack_bf16(w) for w in weights]
    quant = []
    for w in weights:
        scale = (w.float().abs().amax(1) / 127).clamp_min(1e-8)
        q = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
        quant.append((torch.ops.onednn.qlinear_prepack(q, None), scale, torch.zeros(n, dtype=torch.int64)))

    def int8_linear(x: torch.Tensor, i: int) -> torch.Tensor:
        xf = x.float()
        lo, hi = min(xf.min().item(), 0.0), max(xf.max().item(), 0.0)
        sc = max((hi - lo) / 255, 1e-8)
        zp = int(round(-lo / sc))
        qx = torch.clamp(torch.round(xf / sc) + zp, 0, 255).to(torch.uint8)
        qw, ws, wz = quant[i]
        y: torch.Tensor = torch.ops.onednn.qlinear_pointwise(
            qx, sc, zp, qw, ws, wz, None, 1.0, 0, torch.bfloat16, "none", [], ""
        )
        return y

    rows = []
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, k).to(torch.bfloat16)
        state = {"i": 0}

        def bf16() -> None:
            i = state["i"] = (state["i"] + 1) % count
            cpu_packed.linear_bf16(x, packed[i], None)

        def int8() -> None:
            i = state["i"] = (state["i"] + 1) % count
            int8_linear(x, i)

        tb = min(_time(bf16, 60) for _ in range(args.rounds))
        tq = min(_time(int8, 60) for _ in range(args.rounds))
        ref = cpu_packed.linear_bf16(x, packed[0], None).float()
        err = ((int8_linear(x, 0).float() - ref).norm() / ref.norm()).item()
        row = {"rows": m, "bf16_ms": tb * 1e3, "int8_ms": tq * 1e3, "bf16_over_int8": tb / tq, "rel_err": err}
        rows.append(row)
        print(
            f"rows {m:4d}: bf16 packed {tb * 1e3:.3f} ms, int8 {tq * 1e3:.3f} ms, ratio {tb / tq:.2f}, rel err {err:.4f}"
        )
    out = write_cpu_result("cpu_int8_dynamic", {"args": vars(args)}, rows=rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
