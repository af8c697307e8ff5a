#!/usr/bin/env bash
# Regenerate requirements.lock, the pinned whole environment (every package loraplex[test,bench,ray,
# otel] needs, transitively) with pip-tools. torch stays the CPU build constraints.txt asks for (pip
# finds it on local disk; uv would not). Pins already in the lock are kept unless pyproject.toml needs
# another version; move one on purpose with: scripts/lock.sh --upgrade-package NAME
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m piptools compile --quiet --strip-extras --no-header --no-emit-index-url \
    --no-emit-find-links --extra test --extra bench --extra ray --extra otel \
    -c constraints.txt -o requirements.lock "$@" pyproject.toml
