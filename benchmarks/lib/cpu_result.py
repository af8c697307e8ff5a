"""A CPU benchmark's JSON in ``benchmarks/results/``: its rows with what every CPU table must state
(the CPU model, the kernel kind chosen from its flags, the flags, the load average and when)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.paths import RESULTS
from loraplex.kernels.cpu_packed import cpu_kind


def write_cpu_result(name: str, meta: dict[str, Any], **payload: Any) -> Path:
    """Write ``{"meta": {cpu, kind, flags, load_end, when, **meta}, **payload}`` to ``<name>.json``."""
    kind = cpu_kind()
    full = {
        "cpu": kind.model,
        "kind": kind.name,
        "flags": list(kind.flags),
        "load_end": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **meta,
    }
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": full, **payload}, indent=2))
    return out
