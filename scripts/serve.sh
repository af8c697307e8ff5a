#!/usr/bin/env bash
# Install and run the main job: `loraplex serve` with the embedded demo model on CPU + SQLite.
# Extra arguments go to `loraplex serve` (e.g. --port 8000 --model /path/to/checkpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh client   # + the openai SDK: the snippet serve prints runs as pasted
exec .venv/bin/loraplex serve "$@"
