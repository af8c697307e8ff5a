#!/usr/bin/env bash
# ruff (lint + format check) and mypy, as CI runs them. `scripts/lint.sh --fix` applies ruff's fixes
# and formatting instead of only checking.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
if [ "${1:-}" = "--fix" ]; then
    "$PY" -m ruff check --fix .
    "$PY" -m ruff format .
else
    "$PY" -m ruff check .
    "$PY" -m ruff format --check .
fi
# mypy needs the import names (loraplex.engine, ...), but the code folders sit at the repo root and
# are mapped into the namespace at install time: give mypy the same mapping as a tree of symlinks.
TREE=build/typecheck
mkdir -p "$TREE/loraplex"
for d in engine kernels platform migrations admin_ui; do ln -sfn "../../../$d" "$TREE/loraplex/$d"; done
(cd "$TREE" && "../../$PY" -m mypy --config-file ../../pyproject.toml \
    -p loraplex.engine -p loraplex.kernels -p loraplex.platform)
# Layer contracts (.importlinter): engine imports no platform/FastAPI/SQLAlchemy, kernels import no
# engine, platform uses only loraplex.engine's public names. Same symlink tree, same reason.
if ! contracts=$(cd "$TREE" && "../../$PY" -c "import sys; from importlinter.cli import lint_imports_command
sys.argv = ['lint-imports', '--no-cache', '../../.importlinter']; sys.exit(lint_imports_command())" 2>&1); then
    echo "$contracts"
    exit 1
fi
echo "$contracts" | grep -E "KEPT|Contracts:"
