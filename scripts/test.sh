#!/usr/bin/env bash
# Install everything and run the whole test suite: Python deps into .venv, PostgreSQL from Debian
# (started on 127.0.0.1:55432 for the DB tests, stopped afterwards). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-venv.sh test,bench,ray

# PostgreSQL (a real server on loopback, owned by this run) and Chromium (admin UI tests), from
# Debian in one apt-get call.
APT_PKGS=""
ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 || APT_PKGS="postgresql"
[ -x /usr/bin/chromium ] || APT_PKGS="$APT_PKGS chromium"
if [ -n "$APT_PKGS" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # shellcheck disable=SC2086
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $APT_PKGS >/dev/null) \
        || echo "warning: could not install ${APT_PKGS# }; their tests (PostgreSQL, admin UI) will be skipped"
fi
PG_DIR=""
cleanup() {
    if [ -n "$PG_DIR" ]; then
        runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DIR/data" -m fast stop >/dev/null 2>&1 || true
        rm -rf "$PG_DIR"
    fi
}
trap cleanup EXIT
if ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    PGBIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
    PG_PORT=${LORAPLEX_TEST_PG_PORT:-55432}
    PG_DIR=$(mktemp -d)
    chown postgres "$PG_DIR"
    runuser -u postgres -- "$PGBIN/initdb" -D "$PG_DIR/data" -A trust -U postgres >/dev/null
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
        -o "-k $PG_DIR -p $PG_PORT -c listen_addresses=127.0.0.1" start >/dev/null
    PSQL="$PGBIN/psql"; [ -x "$PSQL" ] || PSQL=psql
    "$PSQL" -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc "create database loraplex_test" >/dev/null
    export LORAPLEX_TEST_POSTGRES_URL="postgresql+psycopg://postgres@127.0.0.1:${PG_PORT}/loraplex_test"
fi

export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
# Every Triton kernel compiles for sm_80 and sm_90 without spills or excess shared memory (no GPU
# needed). Only on a whole-suite run (no pytest arguments): a targeted run stays quick.
if [ "$#" -eq 0 ]; then
    scripts/gpu-check.sh --aot
fi
# Coverage of the loraplex package (in-process code; servers started as subprocesses are not traced).
.venv/bin/python -m pytest -q --cov=loraplex --cov-report=term:skip-covered "$@"
