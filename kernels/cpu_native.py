"""Native CPU kernels: paged attention that reads the KV cache in place (``csrc/cpu_attention.cpp``).

Why native: the plain-torch twin has to gather every sequence's KV blocks into a padded tensor
(``index_select``) before SDPA can run, each decode step, in every layer; at serving batch sizes that
copy and the per-length-bucket calls were ~40% of a CPU decode step. The C++ kernel walks the block
table directly, one call per layer for the whole batch, OpenMP over (query row, KV head).

Build: the source has no torch headers, so the system C++ compiler builds it in about a second
(``-O3 -march=native -fopenmp``) the first time it is needed, into a cache keyed by the source, the
flags, the compiler and the CPU; later processes just load it. ``ctypes`` calls it with raw data
pointers (the GIL is released during the call). Without a compiler, or if the build fails, ``load()``
returns None and dispatch keeps the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from . import reference

_SOURCE = Path(__file__).resolve().parent / "csrc" / "cpu_attention.cpp"
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-std=c++17"]
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loraplex" / "kernels"


def _cpu_signature() -> str:
    # -march=native code is only valid on the CPU it was built on: key the cache by its flags.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def library_path(cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256("\0".join([_SOURCE.read_text(), " ".join(_FLAGS), version, _cpu_signature()]).encode())
    return _cache_dir() / f"cpu_attention-{key.hexdigest()[:16]}.so"


def build(cxx: str) -> Path:
    """Compile the kernel library unless the cache has it; atomic so concurrent processes are safe."""
    path = library_path(cxx)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *_FLAGS, str(_SOURCE), "-o", tmp], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{cxx} failed to build {_SOURCE.name}:\n{proc.stderr[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load() -> ctypes.CDLL | None:
    """The kernel library, built on first use; None where it cannot be built (warned once)."""
    global _lib, _tried
    with _lock:
        if _tried:
            return _lib
        _tried = True
        cxx = _compiler()
        if cxx is None:
            warnings.warn(
                "no C++ compiler found: CPU attention uses the slower torch path", RuntimeWarning, stacklevel=2
            )
            return None
        try:
            lib = ctypes.CDLL(str(build(cxx)))
        except (OSError, RuntimeError) as exc:
            warnings.warn(
                f"native CPU attention unavailable, using the torch path: {exc}", RuntimeWarning, stacklevel=2
            )
            return None
        p, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        for name in ("lp_paged_attention_f32", "lp_paged_attention_bf16"):
            fn = getattr(lib, name)
            fn.argtypes = [p, p, p, p, i32, p, p, p, i32, i32, i32, i32, i32, f32, i32]
            fn.restype = None
        _lib = lib
        return _lib


def available() -> bool:
    return load() is not None


def _supported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    # fp16 (poor CPU support) and foreign devices keep the torch path.
    return (
        _lib is not None
        and q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.bfloat16)
        and k_cache.dtype == q.dtype
        and v_cache.dtype == q.dtype
        and k_cache.is_contiguous()
        and v_cache.is_contiguous()
    )


def _call(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    row_seq: torch.Tensor,
    row_len: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    assert _lib is not None
    q = q.contiguous()
    out = torch.empty_like(q)
    rows, hq, d = q.shape
    bt = block_tables.to(torch.int32).contiguous()
    row_seq = row_seq.to(torch.int32).contiguous()
    row_len = row_len.to(torch.int32).contiguous()
    fn = _lib.lp_paged_attention_f32 if q.dtype == torch.float32 else _lib.lp_paged_attention_bf16
    with torch.profiler.record_function("loraplex::cpu_paged_attention"):  # visible in torch.profiler tables
        fn(
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            bt.data_ptr(),
            bt.shape[1] if bt.dim() == 2 else 0,
            row_seq.data_ptr(),
            row_len.data_ptr(),
            out.data_ptr(),
            rows,
            hq,
            k_cache.shape[2],
            d,
            k_cache.shape[1],
            float(scale),
            torch.get_num_threads(),
        )
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as ``reference.paged_decode_attention``."""
    if q.shape[0] == 0 or not _supported(q, k_cache, v_cache):
        return reference.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    rows = torch.arange(q.shape[0], dtype=torch.int32)
    return _call(q, k_cache, v_cache, block_tables, rows, context_lens, scale)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as ``reference.paged_prefill_attention``: query row i of sequence s sees
    positions ``< context_len - query_len + i + 1``."""
    if q.shape[0] == 0 or not _supported(q, k_cache, v_cache):
        return reference.paged_prefill_attention(
            q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale
        )
    qsl = query_start_loc.long()
    qlens = qsl[1:] - qsl[:-1]
    row_seq = torch.repeat_interleave(torch.arange(qlens.shape[0]), qlens)
    offset = torch.arange(q.shape[0]) - qsl[:-1].index_select(0, row_seq)
    row_len = (context_lens.long() - qlens).index_select(0, row_seq) + offset + 1
    return _call(q, k_cache, v_cache, block_tables, row_seq, row_len, scale)
