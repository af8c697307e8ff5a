"""INT4 linear layers at decode batch sizes: the direct kernel per ISA build vs dequantize + dense GEMM.

    .venv/bin/python -m benchmarks.kernels.cpu_int4 [--threads 1] [--rows 1,2,4,8,16,32] [--rounds 5] [--group 128]

SmolLM2-135M's decoder linear shapes (as the engine fuses them), float32 activations. Per shape
and row count, one ``[rows, K] x [K, N]`` matmul by:
  * ``fp32``: dense ``F.linear`` on the float32 weight (what an unquantized model runs);
  * ``deq+gemm``: the native dequantization of the whole int4 weight into float32, then ``F.linear``
    (``cpu_int4``'s path past ``DIRECT_MAX_ROWS`` rows, and the natural way to use int4 without a kernel);
  * ``avx512``, ``avx2`` (and ``scalar`` with ``--scalar``): ``lp_int4_linear_f32`` reading the packed
    codes directly, each from its own build of the native library (the ISA builds the kernel tests
    compile; those this CPU cannot run are left out).
Enough distinct weights are cycled per shape that they do not stay in the cache (a decode step
streams the whole model); the configurations alternate inside every round, the order reversed each
round, so the machine's load lands on all alike. CPU time of this process per call (steadier than
wall time on a shared machine), median of the rounds. Writes ``benchmarks/results/cpu_int4.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.lib.cpu_result import write_cpu_result
from loraplex.kernels import cpu_int4, cpu_native, cpu_packed, pack_int4, quantize_int4

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}  # name: (K, N)
WORKING_SET = 64 << 20  # bytes of distinct float32 weights per shape: beyond a server's L3 share
BUILDS = {  # extra compiler flags of each ISA build (tests/kernels/test_kernels_int4.py builds the same)
    "avx512": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"),
    "avx2": ("-mno-avx512f",),
    "scalar": ("-mno-avx512f", "-mno-avx2", "-mno-fma", "-mno-f16c"),
}


def _time(fn: Callable[[], object], reps: int) -> float:
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def _libraries(names: list[str]) -> dict[str, object]:
    cxx = cpu_native._compiler()
    if cxx is None:
        raise SystemExit("no C++ compiler: no native int4 kernels to measure")
    flags = set(cpu_native._cpu_signature().split())
    runnable = {"avx512": "avx512f" in flags, "avx2": {"avx2", "fma"} <= flags, "scalar": True}
    libs = {}
    for name in names:
        if not runnable[name]:
            print(f"skipping the {name} build: this CPU cannot run it")
            continue
        lib = cpu_native.open_library(cpu_native.build(cxx, BUILDS[name]))
        assert cpu_int4.isa(lib) == name, (name, cpu_int4.isa(lib))
        libs[name] = lib
    return libs


def _direct(lib: object, x: torch.Tensor, w) -> torch.Tensor:
    """``lp_int4_linear_f32`` of one library build (what ``cpu_int4.int4_linear`` calls for few rows)."""
    kp = w.codes.shape[1] * 2  # K padded to whole groups: the kernel reads x zero-padded to it
    x = cpu_int4._padded_f32(x, kp)
    m, n = x.shape[0], w.codes.shape[0]
    y = torch.empty(m, n)
    lib.lp_int4_linear_f32(  # type: ignore[attr-defined]
        x.data_ptr(), x.stride(0), m, kp, w.codes.data_ptr(), w.scales.data_ptr(), w.offsets.data_ptr(), n,
        w.group_size, None, y.data_ptr(), y.stride(0), torch.get_num_threads(),
    )  # fmt: skip
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--scalar", action="store_true", help="also the portable build (slow)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kind = cpu_packed.cpu_kind()
    load_start = os.getloadavg()
    print(f"CPU: {kind.model} | kind {kind.name} | flags {' '.join(kind.flags)} | load {load_start}")
    libs = _libraries(["avx512", "avx2"] + (["scalar"] if args.scalar else []))
    native = cpu_native.load()
    assert native is not None
    results = []
    names = ["fp32", "deq+gemm", *libs]
    print(f"{'shape':8s} {'rows':>4s} " + " ".join(f"{c + ' µs':>12s}" for c in names) + "   fastest")
    for shape in args.shapes.split(","):
        k, n = SHAPES[shape]
        count = max(1, WORKING_SET // (n * k * 4))
        g = torch.Generator().manual_seed(0)
        dense = [torch.randn(n, k, generator=g) * 0.05 for _ in range(count)]
        packed = [pack_int4(*quantize_int4(w, args.group), args.group) for w in dense]
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k)
            state = {"i": 0}

            def nxt() -> int:
                state["i"] = (state["i"] + 1) % count
                return state["i"]

            configs: dict[str, Callable[[], object]] = {
                "fp32": lambda: F.linear(x, dense[nxt()]),
                "deq+gemm": lambda: F.linear(x, cpu_int4.dequantize(packed[nxt()], k, torch.float32)),
            }
            for name, lib in libs.items():
                configs[name] = lambda lib=lib: _direct(lib, x, packed[nxt()])
            ref = F.linear(x, cpu_int4.dequantize(packed[0], k, torch.float32))
            for name, lib in libs.items():  # every build computes the same product
                state["i"] = count - 1
                err = (_direct(lib, x, packed[0]) - ref).abs().max().item()
                assert err <= 1e-3 * ref.abs().max().item(), (name, err)
            reps = max(3, min(400, int(4e8 / (max(m, 4) * n * k)) + count))
            for fn in configs.values():
                _time(fn, count)  # warm-up
            times: dict[str, list[float]] = {c: [] for c in configs}
            for r in range(args.rounds):
                for c in list(configs) if r % 2 == 0 else list(reversed(configs)):
                    times[c].append(_time(configs[c], reps))
            med = {c: statistics.median(t) * 1e6 for c, t in times.items()}
            row = {
                "shape": shape,
                "rows": m,
                "k": k,
                "n": n,
                "group": args.group,
                **{f"{c}_us": v for c, v in med.items()},
            }
            results.append(row)
            best = min(med, key=med.__getitem__)
            print(f"{shape:8s} {m:4d} " + " ".join(f"{med[c]:12.1f}" for c in names) + f"   {best}")
    meta = {"threads": args.threads, "group": args.group, "load_start": load_start}
    out = write_cpu_result("cpu_int4", meta, rows=results)
    print(f"load {os.getloadavg()}; wrote {out}")


if __name__ == "__main__":
    main()
