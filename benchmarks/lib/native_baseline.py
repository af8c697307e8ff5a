"""The native CPU kernel library with ONE source file as of an older git ref, the rest as they are:
the "before" side of a kernel A/B in one process (benchmarks/kernels/cpu_sgmv.py,
cpu_decode_attention.py; benchmarks/peers/adapter_ratio.py)."""

from __future__ import annotations

import ctypes
import subprocess
import tempfile
from pathlib import Path

from benchmarks.lib.paths import ROOT
from loraplex.kernels import cpu_native


def build_with_old_source(ref: str, name: str) -> ctypes.CDLL:
    """The library built with ``kernels/csrc/<name>`` from git ``ref`` (headers and the other
    sources from the working tree), compiled with the same flags as the real one."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{Path(name).stem}-baseline-"))
    old = subprocess.run(
        ["git", "show", f"{ref}:kernels/csrc/{name}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    srcs = []
    for src in (*cpu_native._SOURCES, *cpu_native._HEADERS):
        dst = tmp / src.name
        dst.write_text(old if src.name == name else src.read_text())
        if src in cpu_native._SOURCES:
            srcs.append(str(dst))
    cxx = cpu_native._compiler()
    assert cxx is not None, "no C++ compiler"
    subprocess.run([cxx, *cpu_native._FLAGS, *srcs, "-o", str(tmp / "lib.so")], check=True)
    return cpu_native.open_library(tmp / "lib.so")
