#!/usr/bin/env bash
# GPU checks.
#   scripts/gpu-check.sh --aot   compile every Triton kernel for sm_80 and sm_90 here, no GPU needed:
#                                one resource table; fails on a compile error, a spill, or too much
#                                shared memory (CI runs this).
#   scripts/gpu-check.sh         on a CUDA machine: kernels vs the torch reference + timings, and the
#                                throughput / multi-LoRA benchmarks on a random ~1B model (< 8 min).
# Extra arguments go to the Python script (e.g. --targets 90, --jobs 4, --quick / --skip-engine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ "${1:-}" = "--aot" ]; then
    shift
    exec "$PY" scripts/gpu_check/aot.py "$@"
fi
exec "$PY" -m scripts.gpu_check.cuda_check "$@"  # a module: it imports benchmarks.lib from the root
