"""bf16 linear layers on a weight packed once at load, for CPUs with native bf16 (AMX, AVX512-BF16).

Why: on a CPU with native bf16, ``dtype="auto"`` serves bf16, and ``F.linear`` on a plain
[out, in] weight makes oneDNN reorder (copy) the weight into its blocked layout on every call: at
decode batch sizes that copy is as large as the GEMM's own read of the weight. vLLM's CPU path
avoids it by packing every linear weight once at load; this does the same through torch's own
oneDNN ops: ``torch.ops.mkldnn._reorder_linear_weight`` makes the blocked copy (an opaque mkldnn
tensor, the layout oneDNN picks for this CPU: AMX tiles on an AMX Xeon, AVX512-BF16 dot-product
blocks on Cooper Lake / Zen 4), ``torch.ops.mkldnn._linear_pointwise`` multiplies with it.

Chosen by CPU kind at load (``cpu_kind()``): ``amx`` and ``avx512_bf16`` pack; ``none`` (no
native bf16: bf16 is emulated, and ``dtype="auto"`` serves float32 there anyway) keeps
``F.linear``, which stays the oracle of this path in the tests on every CPU. On ``avx512_bf16``
the copy is ours instead: "pair panels" for our vdpbf16ps kernel (``csrc/cpu_linear_bf16.cpp``,
``pair_panels.py``; measured faster at decode batch sizes, ``BF16_LINEAR`` below), and
``LORAPLEX_BF16_LINEAR`` picks either on either kind.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

from . import cpu_native, pair_panels
from .ops import packed_replaces_weight, replaced_weight
from .profiler_range import profiler_range

KINDS = ("amx", "avx512_bf16", "none")


class CpuSettingError(ValueError):
    """An environment override (``LORAPLEX_CPU_KIND``, ``LORAPLEX_BF16_LINEAR``) names something
    that does not exist: the engine refuses to start with it (``loraplex serve``: one line, exit 2)."""


@dataclass(frozen=True)
class CpuKind:
    """What the linear layers key on: ``name`` one of ``KINDS``; ``model`` and ``flags`` (the ones
    that matter here) for benchmark tables."""

    name: str
    model: str
    flags: tuple[str, ...]


_RELEVANT = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2", "f16c")


def kind_from_flags(flags: set[str]) -> str:
    if {"amx_bf16", "amx_tile"} <= flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    return "none"


@cache
def _probe() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")) and ":" in line:
                flags = frozenset(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return model, flags


def cpu_kind() -> CpuKind:
    """This CPU's kind, from /proc/cpuinfo. ``LORAPLEX_CPU_KIND`` (read at each call, i.e. at each
    engine load) overrides it: tests and A/B benchmarks take another kind's path on this machine."""
    model, flags = _probe()
    name = os.environ.get("LORAPLEX_CPU_KIND") or kind_from_flags(set(flags))
    if name not in KINDS:
        raise CpuSettingError(f"LORAPLEX_CPU_KIND must be one of {KINDS}, got {name!r}")
    return CpuKind(name=name, model=model, flags=tuple(f for f in _RELEVANT if f in flags))


def onednn_bf16() -> bool:
    """Whether this torch has oneDNN AND this CPU can run its bf16 path: oneDNN refuses a CPU without
    avx512bw/vl/dq or avx_ne_convert (an AVX2-only EPYC, say) even when the kind is forced, as tests do."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packs_bf16(kind: str | None = None) -> bool:
    """Whether bf16 weights get a packed copy on this CPU kind (and oneDNN's bf16 runs here)."""
    return (kind or cpu_kind().name) in ("amx", "avx512_bf16") and onednn_bf16()


# Prompt tokens one engine step needs before its prefill runs at (about) its full rate on this CPU
# kind, for a bf16 model on the packed linears: the engine's default ``prefill_group_tokens``
# (a burst is prefilled in groups of this many tokens, so its first prompts stream early; the later
# groups' steps stretch the first ones' inter-token gaps, and smaller GEMMs cost a few % of
# throughput: the server-level trade is measured in docs/cpu-performance.md). Measured, not chosen: ``benchmarks/engine/prefill_group.py`` (a whole engine step)
# on the AVX512-BF16 EPYC and ``benchmarks/kernels/cpu_linear_bf16.py`` (the packed GEMM's rate by
# rows) on the AMX Xeon, tables in docs/cpu-performance.md. ``none`` runs float32 (``auto``), not
# measured: 0 = no grouping there.
PREFILL_GROUP_TOKENS = {"amx": 256, "avx512_bf16": 256, "none": 0}


def prefill_group_tokens(dtype: torch.dtype, kind: str | None = None) -> int:
    """The engine's default step size for a burst's prefill groups (0: no grouping)."""
    if dtype != torch.bfloat16 or not packs_bf16(kind):
        return 0
    return PREFILL_GROUP_TOKENS[kind or cpu_kind().name]


# The bf16 linear each kind with native bf16 runs (read at load, by ``CpuLinearOps``):
# "pair_panels": our vdpbf16ps kernel on a copy in pair panels (``csrc/cpu_linear_bf16.cpp``);
# "onednn": oneDNN's blocked copy (AMX tiles on an AMX Xeon, AVX512-BF16 blocks on Zen 4).
# Measured on the AVX512-BF16 EPYC (docs/cpu-performance.md "A decode GEMM of our own"): a decode
# step's GEMMs 1.16-1.38x oneDNN's at 1-64 rows, 1.05x at 256; over HTTP beside vLLM's load
# generator 1.00x at 16 clients and 1.08x at 64 (medians of 3 alternating rounds). AMX keeps
# oneDNN, which multiplies on the AMX tiles there (our kernel not measured: no AMX machine).
# ``LORAPLEX_BF16_LINEAR`` (read at each load, like ``LORAPLEX_CPU_KIND``) picks the other one.
BF16_LINEAR = {"amx": "onednn", "avx512_bf16": "pair_panels"}
BF16_LINEARS = ("onednn", "pair_panels")


def bf16_linear(kind: str) -> str | None:
    """The bf16 linear ``kind`` runs: ``LORAPLEX_BF16_LINEAR`` if set, else ``BF16_LINEAR``
    (None: a kind without native bf16, which packs nothing)."""
    override = os.environ.get("LORAPLEX_BF16_LINEAR")
    if override and override not in BF16_LINEARS:  # refused on every kind, not only where it is read
        raise CpuSettingError(f"LORAPLEX_BF16_LINEAR must be one of {BF16_LINEARS}, got {override!r}")
    if kind not in BF16_LINEAR:
        return None
    return override or BF16_LINEAR[kind]


def check_environment() -> None:
    """Raise ``CpuSettingError`` now if an override is unknown, before anything is loaded."""
    bf16_linear(cpu_kind().name)


def pack_bf16(weight: torch.Tensor, kind: str | None = None) -> torch.Tensor | None:
    """oneDNN's blocked copy of a bf16 [out, in] ``weight`` for ``linear_bf16``, or None where
    this CPU kind keeps the plain weight (or the weight is not a bf16 CPU matrix)."""
    if not _bf16_matrix(weight) or not packs_bf16(kind):
        return None
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
    return packed


def _bf16_matrix(weight: torch.Tensor) -> bool:
    return (
        weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2 and 0 not in weight.shape
    )


def pair_panels_available() -> bool:
    """Whether the native library has the vdpbf16ps kernel (built for a CPU with AVX512-BF16)."""
    lib = cpu_native.load()
    return lib is not None and bool(lib.lp_linear_bf16_dp_isa())


def pack_pair_panels(weight: torch.Tensor) -> torch.Tensor | None:
    """The pair-panel copy of a bf16 [out, in] ``weight`` for ``linear_pair_panels``, or None where
    the kernel cannot take it (not a bf16 CPU matrix, a shape without whole panels, no kernel)."""
    if not _bf16_matrix(weight) or not pair_panels.fits(weight) or not pair_panels_available():
        return None
    return pair_panels.pack(weight)


def linear_pair_panels(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for bf16 ``x`` of any leading shape through
    ``pack_pair_panels(weight)``: fp32 accumulation, one rounding to bf16, rows independent."""
    lib = cpu_native._lib  # loaded when the copy was packed (pair_panels_available)
    assert lib is not None
    n, k = packed.shape[0] * pair_panels.PANEL, packed.shape[1] * 2
    lead = x.shape[:-1]
    assert x.shape[-1] == k, f"input of {x.shape[-1]} features for a [{n}, {k}] weight"
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], n, dtype=torch.bfloat16)
    b = None if bias is None else bias.contiguous()
    with profiler_range("loraplex::cpu_linear_bf16"):
        lib.lp_linear_bf16_dp(
            x2.data_ptr(), x2.stride(0), x2.shape[0], k, packed.data_ptr(), n, None if b is None else b.data_ptr(),
            y.data_ptr(), n, torch.get_num_threads(),
        )  # fmt: skip
    return y.reshape(*lead, n)


def is_packed_bf16(packed: torch.Tensor | None) -> bool:
    return packed is not None and packed.is_mkldnn


def linear_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through ``pack_bf16(weight)``: bf16 activations of any
    leading shape; the same oneDNN kernels as ``F.linear`` minus the per-call weight reorder."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) != x2.shape[1]):
        x2 = x2.contiguous()  # oneDNN reads a dense matrix
    y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x2, packed, bias, "none", [], "")
    return y.reshape(*lead, y.shape[-1])


def packed_nbytes(packed: torch.Tensor) -> int:
    """Bytes a packed copy holds (an opaque oneDNN tensor has no torch storage to ask)."""
    if packed.is_mkldnn:
        return int(torch.ops.mkldnn._nbytes(packed))
    return packed.numel() * packed.element_size()


class CpuLinearOps:
    """``KernelOps.pack_linear_weight`` / ``linear`` of the native CPU backend, by the weight's
    dtype and the CPU kind (fixed at construction, i.e. at load):

    * bf16 weight on a kind with native bf16: ``bf16_linear(kind)`` — pair panels for our
      vdpbf16ps kernel (``avx512_bf16``; oneDNN's copy wherever the panels cannot take the
      weight) or oneDNN's blocked copy (``amx``), used at every batch size; either holds every number of the
      weight, so the model drops the plain one (``ops.packed_replaces_weight``): no memory added.
    * float32 weight that bf16 holds exactly: the native kernel's bf16 panels for decode-sized
      batches (``cpu_native.pack_linear_weight``; a CPU without native bf16 serves float32).
    * anything else: no copy, ``F.linear`` (the oracle of every path).
    """

    def __init__(self, kind: str, bf16: str | None = None):
        if kind not in KINDS:
            raise ValueError(f"CPU kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.bf16 = bf16 if bf16 is not None else bf16_linear(kind)

    def pack_linear_weight(self, weight: torch.Tensor) -> torch.Tensor | None:
        if weight.dtype == torch.bfloat16:
            if self.bf16 == "pair_panels":
                panels = pack_pair_panels(weight)
                if panels is not None:
                    return panels
            return pack_bf16(weight, self.kind)
        return cpu_native.pack_linear_weight(weight)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, packed: torch.Tensor | None
    ) -> torch.Tensor:
        if packed is not None and packed_replaces_weight(packed):
            if x.dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16):
                return linear_bf16(x, packed, bias) if packed.is_mkldnn else linear_pair_panels(x, packed, bias)
            # Another activation dtype never reaches a bf16 model's layers: behave as F.linear.
            return F.linear(x, replaced_weight(packed) if weight is None else weight, bias)
        assert weight is not None, "a plain weight is only dropped for a copy that replaces it"
        return cpu_native.linear(x, weight, bias, packed)
