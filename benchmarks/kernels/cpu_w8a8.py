"""The W8A8 linear (``kernels/w8a8.py``) against the packed bf16 linear (the default path), one
thread, CPU time, on the demo model's MLP shapes (576 -> 1536 and back), and its parts: the native
per-row quantizer, the torch-ops quantizer it replaces, ``torch._int_mm`` (int32 accumulation, with
the weight as a transposed view or as a [K, N] copy), and the native epilogue.

    .venv/bin/python -m benchmarks.kernels.cpu_w8a8          # ~1 minute

Every configuration of a shape runs in each round, alternating (best of the rounds): on a shared
machine compare ratios.
"""

from __future__ import annotations

import os
import time

import torch

from benchmarks.lib.cpu_result import write_cpu_result
from benchmarks.lib.workload import print_table
from loraplex.kernels import cpu_native, cpu_packed, quantize_per_channel_int8, w8a8

SHAPES = [(576, 1536), (1536, 576)]
ROWS = (1, 16, 64, 256, 2048)


def _cpu_ms(fn, reps: int) -> float:
    fn()
    t = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t) / reps * 1e3


def main() -> None:
    torch.set_num_threads(1)
    assert cpu_native.load() is not None, "needs the native CPU kernels"
    load_start = os.getloadavg()
    rows = []
    for k, n in SHAPES:
        w = torch.randn(n, k).to(torch.bfloat16)
        packed = cpu_packed.pack_bf16(w)
        qw, ws = quantize_per_channel_int8(w)
        qw_kn = qw.t().contiguous()
        for m in ROWS:
            x = torch.randn(m, k).to(torch.bfloat16)
            xq, xs = w8a8.quantize_rows_cpu(x)
            acc = w8a8.int_mm_cpu(xq, qw)
            configs = {
                "packed_bf16": lambda: cpu_packed.linear_bf16(x, packed, None) if packed is not None else w,
                "w8a8": lambda: w8a8.w8a8_linear_cpu(x, qw, ws),
                "quant_native": lambda: w8a8.quantize_rows_cpu(x),
                "quant_torch": lambda: w8a8.quantize_rows_int8(x),
                "int_mm_view": lambda: w8a8.int_mm_cpu(xq, qw),
                "int_mm_kn_copy": lambda: torch._int_mm(xq, qw_kn),
                "epilogue": lambda: w8a8.rescale_cpu(acc, xs, ws, None, torch.bfloat16),
            }
            reps = max(3, 2000 // max(m, 1))
            best = {name: float("inf") for name in configs}
            for _ in range(3):
                for name, fn in configs.items():
                    best[name] = min(best[name], _cpu_ms(fn, reps))
            row = {"K->N": f"{k}->{n}", "rows": m, **{f"{c}_ms": round(v, 3) for c, v in best.items()}}
            row["bf16/w8a8"] = round(best["packed_bf16"] / best["w8a8"], 2)
            rows.append(row)
            print(row, flush=True)
    kind = cpu_packed.cpu_kind()
    print(f"CPU: {kind.model} (kind {kind.name}, flags {' '.join(kind.flags)}); load {load_start} -> {os.getloadavg()}")
    print_table(rows, list(rows[0]))
    print(write_cpu_result("cpu_w8a8", {"load_start": load_start, "threads": 1}, rows=rows))


if __name__ == "__main__":
    main()
