"""Native CPU kernels: paged attention that reads the KV cache in place (``csrc/cpu_attention.cpp``)
and grouped LoRA SGMV (``csrc/cpu_sgmv.cpp``).

Why native: the plain-torch twin has to gather every sequence's KV blocks into a padded tensor
(``index_select``) before SDPA can run, each decode step, in every layer; at serving batch sizes that
copy and the per-length-bucket calls were ~40% of a CPU decode step. The C++ kernel walks the block
table directly, one call per layer for the whole batch, OpenMP over (query row, KV head).

Why a native SGMV: the torch path gathers each token's A and B (``index_select``, a copy per token)
and multiplies with a broadcast that materialises [slices, tokens, rank, hidden] in fp32; over tens
of distinct adapters that was ~40% of a decode step. The native one groups the step's tokens by
slot (once per step, shared by every layer) and reads each adapter's A rows / B column chunks once
per group, straight from the stacked slot tensors.

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

from . import cpu_prompt_attention, reference
from .profiler_range import profiler_range

_SOURCES = tuple(
    Path(__file__).resolve().parent / "csrc" / n
    for n in (
        "cpu_attention.cpp",
        "cpu_sgmv.cpp",
        "cpu_linear.cpp",
        "cpu_linear_bf16.cpp",
        "cpu_prompt_attention.cpp",
        "cpu_elementwise.cpp",
        "cpu_int4.cpp",
        "cpu_w8a8.cpp",
    )
)
_HEADERS = tuple(
    Path(__file__).resolve().parent / "csrc" / n for n in ("bf16.h", "simd_exp.h", "pair_panel_dot.h")
)  # part of the cache key
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


def library_path(cxx: str, extra_flags: tuple[str, ...] = ()) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    texts = [src.read_text() for src in (*_SOURCES, *_HEADERS)]
    flags = " ".join([*_FLAGS, *extra_flags])
    key = hashlib.sha256("\0".join([*texts, flags, version, _cpu_signature()]).encode())
    return _cache_dir() / f"cpu_kernels-{key.hexdigest()[:16]}.so"


def build(cxx: str, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the kernel library unless the cache has it; atomic so concurrent processes are safe.
    ``extra_flags`` (after ``-march=native``) build variants, e.g. ``-mno-avx512f -mno-f16c``: the
    portable fallback a CPU without AVX-512 / F16C gets, which the tests exercise on this one."""
    path = library_path(cxx, extra_flags)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        cmd = [cxx, *_FLAGS, *extra_flags, *map(str, _SOURCES), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            names = ", ".join(src.name for src in _SOURCES)
            raise RuntimeError(f"{cxx} failed to build {names}:\n{proc.stderr[-2000:]}")
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
            lib = open_library(build(cxx))
        except (OSError, RuntimeError) as exc:
            warnings.warn(
                f"native CPU attention unavailable, using the torch path: {exc}", RuntimeWarning, stacklevel=2
            )
            return None
        _lib = lib
        return _lib


SGMV_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
SGMV_ACTIVATIONS = (torch.float32, torch.bfloat16)


def open_library(path: Path) -> ctypes.CDLL:
    """Load a built kernel library and declare its entry points' C signatures."""
    lib = ctypes.CDLL(str(path))
    p, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    for name in ("lp_paged_attention_f32", "lp_paged_attention_bf16"):
        fn = getattr(lib, name)
        fn.argtypes = [p, p, p, p, i32, p, p, p, i32, i32, i32, i32, i32, f32, i32, i32]
        fn.restype = None
    i64 = ctypes.c_int64
    for act in ("f32", "bf16"):
        for w in SGMV_DTYPES.values():
            fn = getattr(lib, f"lp_sgmv_shrink_{act}_{w}")
            fn.argtypes = [p, i64, p, p, i32, i32, i32, i32, i32, p, p, p, i32, p, i32]
            fn.restype = None
            fn = getattr(lib, f"lp_sgmv_expand_{act}_{w}")
            fn.argtypes = [p, i64, p, p, i32, i32, i32, i32, p, p, p, i32, p, p, i32, p, i32]
            fn.restype = None
    lib.lp_sgmv_shrink_bf16_bf16_groups.argtypes = [p, i64, p, p, i32, i32, i32, i32, i32, p, p, p, i32, p, i32, i32]
    lib.lp_sgmv_shrink_bf16_bf16_groups.restype = None
    lib.lp_sgmv_expand_bf16_bf16_groups.argtypes = [
        p,
        i64,
        p,
        p,
        i32,
        i32,
        i32,
        i32,
        p,
        p,
        p,
        i32,
        p,
        p,
        i32,
        p,
        i32,
        i32,
    ]
    lib.lp_sgmv_expand_bf16_bf16_groups.restype = None
    lib.lp_sgmv_prompt_groups.argtypes = []
    lib.lp_sgmv_prompt_groups.restype = i32
    lib.lp_sgmv_fast_f16.argtypes = []
    lib.lp_sgmv_fast_f16.restype = i32
    lib.lp_linear_f32_bf16p.argtypes = [p, i64, i32, i32, p, i32, p, p, i64, i32]
    lib.lp_linear_f32_bf16p.restype = None
    lib.lp_linear_bf16_dp.argtypes = [p, i64, i32, i32, p, i32, p, p, i64, i32]
    lib.lp_linear_bf16_dp.restype = None
    lib.lp_linear_bf16_dp_isa.argtypes = []
    lib.lp_linear_bf16_dp_isa.restype = i32
    lib.lp_prompt_attention_isa.argtypes = []
    lib.lp_prompt_attention_isa.restype = i32
    lib.lp_prompt_attention_bf16.argtypes = [p, i64, p, p, p, i32, p, p, p, p, i32, p, i64, *[i32] * 4, f32, i32]
    lib.lp_prompt_attention_bf16.restype = None
    lib.lp_rms_norm_bf16.argtypes = [p, i64, i32, i32, p, f32, p, i32]
    lib.lp_rms_norm_bf16.restype = None
    lib.lp_silu_mul_bf16.argtypes = [p, i64, i32, i32, p, i32]
    lib.lp_silu_mul_bf16.restype = None
    lib.lp_rotary_bf16.argtypes = [p, i64, i32, i32, i32, p, p, p, i32]
    lib.lp_rotary_bf16.restype = None
    lib.lp_write_kv.argtypes = [p, p, p, i64, p, i64, p, i32, i64]
    lib.lp_write_kv.restype = None
    lib.lp_attention_decode_tile.argtypes = []
    lib.lp_attention_decode_tile.restype = i32
    lib.lp_linear_fast.argtypes = []
    lib.lp_linear_fast.restype = i32
    lib.lp_int4_isa.argtypes = []
    lib.lp_int4_isa.restype = i32
    lib.lp_int4_linear_f32.argtypes = [p, i64, i32, i32, p, p, p, i32, i32, p, p, i64, i32]
    lib.lp_int4_linear_f32.restype = None
    lib.lp_int4_dequant_f32.argtypes = [p, p, p, i32, i32, i32, p, i32]
    lib.lp_int4_dequant_f32.restype = None
    lib.lp_w8a8_isa.argtypes = []
    lib.lp_w8a8_isa.restype = i32
    for act in ("f32", "bf16"):
        fn = getattr(lib, f"lp_w8a8_quant_rows_{act}")
        fn.argtypes = [p, i64, i32, i32, p, p, i32]
        fn.restype = None
        fn = getattr(lib, f"lp_w8a8_rescale_{act}")
        fn.argtypes = [p, i32, i32, p, p, p, p, i32]
        fn.restype = None
    return lib


def fast_float16() -> bool:
    """True when the built kernels convert float16 adapter weights in vector registers (AVX-512),
    so storing adapters in float16 beside a float32 model halves their bytes at no compute cost.
    False without the native library or on the portable build (e.g. a CPU without AVX-512/F16C)."""
    lib = load()
    return lib is not None and bool(lib.lp_sgmv_fast_f16())


def decode_tile_available() -> bool:
    """True when the built kernels have the AVX-512 decode-attention tile (``decode_tile=True`` then
    changes the path decode rows take); False without the library or on the portable build."""
    lib = load()
    return lib is not None and bool(lib.lp_attention_decode_tile())


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
    decode_tile: bool = True,
) -> torch.Tensor:
    assert _lib is not None
    q = q.contiguous()
    out = torch.empty_like(q)
    rows, hq, d = q.shape
    bt = block_tables.to(torch.int32).contiguous()
    row_seq = row_seq.to(torch.int32).contiguous()
    row_len = row_len.to(torch.int32).contiguous()
    fn = _lib.lp_paged_attention_f32 if q.dtype == torch.float32 else _lib.lp_paged_attention_bf16
    with profiler_range("loraplex::cpu_paged_attention"):  # visible in torch.profiler tables
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
            int(decode_tile),
        )
    return out


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    decode_tile: bool = True,
) -> torch.Tensor:
    """Same contract as ``reference.paged_decode_attention``. ``decode_tile=False`` keeps every row
    on the two-pass tile the prefill rows take (a position then has the same bits decoded or
    recomputed in a prefill: ``batch_invariant.py``)."""
    if q.shape[0] == 0 or not _supported(q, k_cache, v_cache):
        return reference.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    rows = torch.arange(q.shape[0], dtype=torch.int32)
    return _call(q, k_cache, v_cache, block_tables, rows, context_lens, scale, decode_tile)


# A prompt chunk that is a whole prompt (no cached prefix) of at least this many tokens goes to a
# causal whole-prompt path: in bf16 on a CPU with AVX512-BF16 the vdpbf16ps kernel of
# csrc/cpu_prompt_attention.cpp (all such prompts in one call), otherwise torch's flash-attention
# SDPA (one batched call per prompt length), which is ~1.9x the native paged kernel's speed for
# batches of 128-token prompts (docs/cpu-performance.md). Where that kernel runs it takes every
# prompt chunk of at least KERNEL_MIN_ROWS rows, whole prompts and chunks over cached positions (a
# chunked prompt's later chunks, a prompt after a prefix-cache hit) alike, in one call: from 16 rows
# it is 2.4-8x the paged tile (benchmarks/engine/prompt_attention.py, "chunks"). Shorter chunks and
# decode rows stay on the native paged kernel (one call for all of them).
SDPA_MIN_ROWS = 64
KERNEL_MIN_ROWS = 16


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    whole_prompt_sdpa: bool = True,
    decode_tile: bool = True,
    prompt_kernel: bool = True,
) -> torch.Tensor:
    """Same contract as ``reference.paged_prefill_attention``: query row i of sequence s sees
    positions ``< context_len - query_len + i + 1``. ``whole_prompt_sdpa=False`` and
    ``decode_tile=False`` keep every row on the native two-pass tile (a 1-token chunk would take
    the decode tile otherwise): per-row results then do not depend on chunking (``batch_invariant.py``).
    ``prompt_kernel=False`` sends whole prompts to SDPA and other chunks to the paged tile even where
    the native prompt kernel runs (the benchmarks' A/B)."""
    if q.shape[0] == 0 or not _supported(q, k_cache, v_cache):
        return reference.paged_prefill_attention(
            q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale
        )
    starts, ctx = query_start_loc.tolist(), context_lens.tolist()
    on_kernel = whole_prompt_sdpa and prompt_kernel and prompt_kernel_applies(q)
    # context length -> the sequences whose chunk leaves the paged tile (SDPA: whole prompts only)
    fresh: dict[int, list[int]] = {}
    for s, c in enumerate(ctx):
        rows = starts[s + 1] - starts[s]
        if whole_prompt_sdpa and (rows >= KERNEL_MIN_ROWS if on_kernel else rows == c >= SDPA_MIN_ROWS):
            fresh.setdefault(c, []).append(s)
    if not fresh:
        return _native_prefill(q, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, decode_tile)
    out = torch.empty_like(q)
    if on_kernel:
        assert _lib is not None  # _supported checked it
        seqs = [s for group in fresh.values() for s in group]
        lens = [starts[s + 1] - starts[s] for s in seqs]
        cpu_prompt_attention.attend(
            q,
            out,
            k_cache,
            v_cache,
            block_tables,
            seqs,
            [starts[s] for s in seqs],
            lens,
            scale,
            lib=_lib,
            offsets=[ctx[s] - n for s, n in zip(seqs, lens)],
        )
    else:
        for length, seqs in fresh.items():
            rows = torch.cat([torch.arange(starts[s], starts[s] + length) for s in seqs])
            out.index_copy_(
                0, rows, cpu_prompt_attention.fresh_sdpa(q, rows, k_cache, v_cache, block_tables, seqs, length, scale)
            )
    done = {s for seqs in fresh.values() for s in seqs}
    rest = [s for s in range(len(ctx)) if s not in done and starts[s + 1] > starts[s]]
    if rest:
        rows = torch.cat([torch.arange(starts[s], starts[s + 1]) for s in rest])
        qlens = torch.tensor([starts[s + 1] - starts[s] for s in rest])
        qsl = torch.zeros(len(rest) + 1, dtype=torch.long)
        torch.cumsum(qlens, 0, out=qsl[1:])
        sub = _native_prefill(
            q.index_select(0, rows), k_cache, v_cache, block_tables[rest], qsl, context_lens[rest], scale, decode_tile
        )
        out.index_copy_(0, rows, sub)
    return out


def prompt_kernel_isa() -> bool:
    """True when the built kernels have the vdpbf16ps whole-prompt attention (AVX512-BF16)."""
    return cpu_prompt_attention.kernel_isa(load())


def prompt_kernel_applies(q: torch.Tensor) -> bool:
    """Whole prompts of ``q`` take the native prompt kernel (``cpu_prompt_attention.applies``)."""
    return cpu_prompt_attention.applies(q, _lib)


def _native_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    decode_tile: bool = True,
) -> torch.Tensor:
    qsl = query_start_loc.long()
    qlens = qsl[1:] - qsl[:-1]
    row_seq = torch.repeat_interleave(torch.arange(qlens.shape[0]), qlens)
    offset = torch.arange(q.shape[0]) - qsl[:-1].index_select(0, row_seq)
    row_len = (context_lens.long() - qlens).index_select(0, row_seq) + offset + 1
    return _call(q, k_cache, v_cache, block_tables, row_seq, row_len, scale, decode_tile)


# ------------------------------------------------------------------------ decode-sized linear layers
PANEL = 16  # output columns per packed panel (one AVX-512 register of float32)
# Rows up to which the packed bf16 kernel runs; larger batches (prefill chunks) are compute-bound
# and go to MKL's float32 GEMM on the original weight.
PACKED_MAX_ROWS = 64


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The float32 ``weight`` [n, k] as bf16 panels [ceil(n/16), k, 16] (zero-padded past n) for
    ``linear``, or None where that would change the model or not pay: not float32 on the CPU, not
    exactly representable in bf16 (only then is the copy lossless), or no AVX-512 build."""
    lib = load()
    if lib is None or not lib.lp_linear_fast() or weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] == 0:
        return None
    w16 = weight.detach().to(torch.bfloat16)
    if not torch.equal(w16.float(), weight.detach()):
        return None
    n, k = weight.shape
    panels = -(-n // PANEL)
    padded = torch.zeros(panels * PANEL, k, dtype=torch.bfloat16)
    padded[:n] = w16
    return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


def unpack_linear_weight(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of ``pack_linear_weight`` (float32 [n, k]); the tests' check that packing is exact."""
    panels, k, _ = packed.shape
    return packed.transpose(1, 2).reshape(panels * PANEL, k)[:n].float()


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; through the packed bf16 copy of ``weight`` (``packed``, from
    ``pack_linear_weight``) when given and the batch is decode-sized."""
    if (
        packed is None
        or _lib is None
        or x.dim() != 2
        or not 0 < x.shape[0] <= PACKED_MAX_ROWS
        or x.dtype != torch.float32
        or x.device.type != "cpu"
        or x.stride(-1) != 1
        or (bias is not None and bias.dtype != torch.float32)
    ):
        return torch.nn.functional.linear(x, weight, bias)
    n, k = weight.shape
    assert x.shape[1] == k and packed.shape == (-(-n // PANEL), k, PANEL) and packed.dtype == torch.bfloat16
    y = torch.empty(x.shape[0], n, dtype=torch.float32)
    b = None if bias is None else bias.contiguous()
    with profiler_range("loraplex::cpu_linear"):
        _lib.lp_linear_f32_bf16p(
            x.data_ptr(), x.stride(0), x.shape[0], k, packed.data_ptr(), n, None if b is None else b.data_ptr(),
            y.data_ptr(), n, torch.get_num_threads(),
        )  # fmt: skip
    return y


# The grouped SGMV ops live in cpu_sgmv.py, a decoder layer's element-wise glue in cpu_elementwise.py
# (both call this module's library).
__all__ = ["paged_decode_attention", "paged_prefill_attention", "linear"]
