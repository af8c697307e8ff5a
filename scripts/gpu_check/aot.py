"""Compile every Triton kernel ahead of time for NVIDIA targets, on a machine without a GPU.

    .venv/bin/python scripts/gpu_check/aot.py [--targets 80,90] [--jobs N]

How the launch configurations are found: the real launchers (``kernels/triton_sgmv.py``,
``kernels/triton_decode_attention.py``, ``kernels/triton_prefill_attention.py``,
``kernels/triton_kv_write.py``) are called over a grid of realistic shapes (``shapes.py``) with
CPU tensors while ``JITFunction.run`` is replaced by a recorder. The recorder binds the arguments
with Triton's own binder for the CUDA backend, so it records exactly the signature, constexprs
and specialisation attributes (divisibility, ints equal to 1) a GPU launch would compile. The
device-dependent choices of the launchers (SM count, fp32-vs-tensor-core dots) are patched to
the target's values while recording. Each distinct configuration is then compiled with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` and its cubin inspected with
the ``cuobjdump`` shipped in Triton's NVIDIA backend.

Fails (exit 1) on any compile error, any register spill (LOCAL > 0), shared memory beyond the
target's per-block limit, or registers x threads beyond the SM's register file.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # must be unset before triton is imported
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the current default, stated (silences a warning)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime import jit as tjit  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shapes  # noqa: E402

# Per-block shared memory a kernel may use (opt-in maximum) and SM count of the reference parts.
TARGETS = {
    80: {"name": "sm_80 (A100)", "smem": 166912, "sms": 108},
    90: {"name": "sm_90 (H100/H200)", "smem": 232448, "sms": 132},
}
REGS_PER_SM = 65536


@dataclass
class Config:
    kernel: str
    arch: int
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    label: str  # the shape that first produced it
    declared: dict  # the kernel's own constexpr parameters by name (for the table)


_captured: dict[tuple, Config] = {}
_arch = 90
_label = ""


def _recording_run(self, *args, grid, warmup, **kwargs):
    """Stand-in for ``JITFunction.run``: bind like a CUDA launch would, record, launch nothing."""
    from triton import knobs

    kwargs.setdefault("debug", self.debug or knobs.runtime.debug)
    kwargs.setdefault("instrumentation_mode", knobs.compilation.instrumentation_mode)
    kwargs.setdefault("fpsan_homomorphic_casts", knobs.compilation.fpsan_homomorphic_casts)
    backend = make_backend(GPUTarget("cuda", _arch, 32))
    binder = tjit.create_function_from_signature(self.signature, self.params, backend)
    bound, spec, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, options)
    # One compile per (kernel, target, pointer dtypes, declared constexprs): variants that differ
    # only in Triton's automatic specialisations (an int that happens to be 1, divisibility by 16)
    # compile to near-identical code, and compiling each would multiply the CI time.
    declared = {self.params[p[0]].name: v for p, v in constexprs.items() if self.params[p[0]].is_constexpr}
    pointers = tuple(v for v in signature.values() if isinstance(v, str) and v.startswith("*"))
    key = (self.fn.__name__, _arch, pointers, repr(sorted(declared.items())))
    if key not in _captured:
        _captured[key] = Config(
            self.fn.__name__, _arch, signature, constexprs, attrs, options.__dict__, _label, declared
        )
    return None


def capture(arch: int) -> list[Config]:
    """Every distinct launch configuration the launchers choose over the shape grid, for ``arch``."""
    global _arch, _label
    from loraplex.kernels import triton_decode_attention, triton_prefill_attention, triton_sgmv

    sms = TARGETS[arch]["sms"]
    saved = (
        tjit.JITFunction.run,
        triton_sgmv._target_programs,
        triton_sgmv.dot_in_f32,
        triton_decode_attention._num_sms,
        triton_decode_attention.dot_in_f32,
        triton_prefill_attention.dot_in_f32,
    )
    gpu_dot_in_f32 = lambda dtype, device: dtype == torch.float32  # noqa: E731  (what CUDA tensors get)
    tjit.JITFunction.run = _recording_run
    triton_sgmv._target_programs = lambda device: 4 * sms
    triton_sgmv.dot_in_f32 = gpu_dot_in_f32
    triton_decode_attention._num_sms = lambda device: sms
    triton_decode_attention.dot_in_f32 = gpu_dot_in_f32
    triton_prefill_attention.dot_in_f32 = gpu_dot_in_f32
    _arch = arch
    before = len(_captured)
    try:
        for label, launch in shapes.launches():
            _label = label
            launch()
    finally:
        (
            tjit.JITFunction.run,
            triton_sgmv._target_programs,
            triton_sgmv.dot_in_f32,
            triton_decode_attention._num_sms,
            triton_decode_attention.dot_in_f32,
            triton_prefill_attention.dot_in_f32,
        ) = saved
    return list(_captured.values())[before:]


_RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _cuobjdump() -> str:
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(path) if path.is_file() else "cuobjdump"


def compile_one(index: int) -> dict:
    """Compile captured config ``index`` (run in a forked worker that inherited ``_captured``)."""
    cfg = list(_captured.values())[index]
    fn = _kernel_fn(cfg.kernel)
    # The model dtype: a 16-bit pointer if any (fp32 pointers may be partials/shrunk buffers).
    ptrs = [v for v in cfg.signature.values() if isinstance(v, str) and v in ("*bf16", "*fp16", "*fp32")]
    dtype = next((v for v in ptrs if v != "*fp32"), ptrs[0] if ptrs else "")
    row = {
        "kernel": cfg.kernel,
        "arch": cfg.arch,
        "label": cfg.label,
        "dtype": dtype.lstrip("*"),
        "constexprs": cfg.declared,
    }
    t0 = time.perf_counter()
    try:
        src = ASTSource(fn, cfg.signature, cfg.constexprs, cfg.attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", cfg.arch, 32), options=cfg.options)
    except Exception as exc:  # noqa: BLE001 - any compiler failure is a reported failure
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return row
    row["compile_s"] = time.perf_counter() - t0
    md = compiled.metadata
    row["num_warps"] = md.num_warps
    row["num_stages"] = getattr(md, "num_stages", None)
    row["triton_shared"] = md.shared
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True)
    m = _RES.search(out.stdout)
    if not m:
        row["error"] = f"cuobjdump gave no resource line: {out.stdout[-200:]} {out.stderr[-200:]}"
        return row
    row["reg"], row["stack"], row["shared"], row["local"] = (int(x) for x in m.groups())
    return row


_FNS: dict[str, object] = {}


def _kernel_fn(name: str):
    if not _FNS:
        from loraplex.kernels import triton_decode_attention, triton_kv_write, triton_prefill_attention, triton_sgmv

        for mod in (triton_sgmv, triton_decode_attention, triton_prefill_attention, triton_kv_write):
            for v in vars(mod).values():
                if isinstance(v, tjit.JITFunction):
                    _FNS[v.fn.__name__] = v
    return _FNS[name]


def all_kernels() -> set[str]:
    try:
        _kernel_fn("")  # fills _FNS
    except KeyError:
        pass
    # Launchable kernels only (helpers called from kernels are @jit functions too).
    return {n for n in _FNS if n.endswith("_kernel")}


def problems(row: dict) -> list[str]:
    if "error" in row:
        return [row["error"]]
    limit = TARGETS[row["arch"]]
    out = []
    if row["local"] > 0:
        out.append(f"spills: LOCAL={row['local']}")
    smem = max(row["shared"], row["triton_shared"])
    if smem > limit["smem"]:
        out.append(f"shared {smem} > {limit['smem']}")
    if row["reg"] * row["num_warps"] * 32 > REGS_PER_SM:
        out.append(f"registers {row['reg']} x {row['num_warps'] * 32} threads > {REGS_PER_SM}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="80,90")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="a reduced shape grid (smoke run)")
    args = ap.parse_args()
    shapes.QUICK = args.quick
    t0 = time.perf_counter()
    for arch in (int(a) for a in args.targets.split(",")):
        capture(arch)
    n = len(_captured)
    print(
        f"{n} distinct launch configurations captured in {time.perf_counter() - t0:.1f} s; compiling with "
        f"{args.jobs} jobs ...",
        flush=True,
    )
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("fork")) as pool:
        rows = list(pool.map(compile_one, range(n)))
    covered = {r["kernel"] for r in rows}
    missing = sorted(all_kernels() - covered)
    failures = 0
    header = f"{'kernel':22s} {'arch':4s} {'dtype':5s} {'constexprs':70s} {'warps':>5s} {'REG':>4s} {'LOCAL':>5s} {'SHARED':>7s} status"
    print(header)
    print("-" * len(header))
    for r in sorted(rows, key=lambda r: (r["kernel"], r["arch"], r["dtype"], repr(r["constexprs"]))):
        bad = problems(r)
        failures += bool(bad)
        ce = ",".join(f"{k}={v}" for k, v in r["constexprs"].items())
        if "error" in r:
            print(
                f"{r['kernel']:22s} {r['arch']:<4d} {r['dtype']:5s} {ce[:70]:70s} {'':>5s} {'':>4s} {'':>5s} {'':>7s} FAIL {bad[0]}"
            )
            continue
        smem = max(r["shared"], r["triton_shared"])
        # At the 255-register cap without spilling: passes, but flagged (one more live value spills).
        status = ("ok" + (" (REG at cap)" if r["reg"] >= 255 else "")) if not bad else "FAIL " + "; ".join(bad)
        print(
            f"{r['kernel']:22s} {r['arch']:<4d} {r['dtype']:5s} {ce[:70]:70s} {r['num_warps']:>5d} {r['reg']:>4d} {r['local']:>5d} "
            f"{smem:>7d} {status}"
        )
    for name in missing:
        failures += 1
        print(f"FAIL: kernel {name} was never launched by the shape grid (add it to scripts/gpu_check/shapes.py)")
    for arch in sorted({r["arch"] for r in rows}):
        rs = [r for r in rows if r["arch"] == arch and "error" not in r]
        if rs:
            print(
                f"{TARGETS[arch]['name']}: {len(rs)} compiled, max REG {max(r['reg'] for r in rs)}, "
                f"max SHARED {max(max(r['shared'], r['triton_shared']) for r in rs)} B "
                f"(limit {TARGETS[arch]['smem']}), spills {sum(r['local'] > 0 for r in rs)}"
            )
    print(f"{n} configurations, {failures} failures, {time.perf_counter() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
