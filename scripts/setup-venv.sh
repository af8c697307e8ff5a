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
