"""A named ``torch.profiler`` range around a native kernel call, entered only while a profiler
runs.

The native kernels are ctypes calls, invisible to ``torch.profiler`` unless wrapped in a
``record_function`` (``benchmarks/peers/step_profile.py`` files them by these names). Entering one
costs ~6-7 µs even with no profiler running, and a bf16 decode step calls ~150-400 kernels
(RMSNorm, SiLU, attention, linear, SGMV per layer): about a millisecond of a ~40 ms step. Without a
profiler this returns a shared no-op context instead (~0.1 µs)."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

_profiling = torch.autograd._profiler_enabled
_NOTHING = contextlib.nullcontext()


def profiler_range(name: str) -> AbstractContextManager[object]:
    """``torch.profiler.record_function(name)`` while a profiler runs, else a no-op context."""
    if _profiling():
        return torch.profiler.record_function(name)
    return _NOTHING
