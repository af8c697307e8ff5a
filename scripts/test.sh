#!/usr/bin/env bash
# Install everything and run the whole test suite: Python deps into .venv (a no-op when nothing
# changed), PostgreSQL from Debian (a private server on loopback for the DB tests, stopped afterwards).
# Extra args go to pytest; the inner loop is `scripts/test.sh -m "not slow"` (see CONTRIBUTING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase.sh
phase setup-venv scripts/setup-venv.sh test,bench,ray

# PostgreSQL (a real server on loopback, owned by this run), Chromium (admin UI tests) and Prometheus
# (promtool and a real server for the rules/dashboard tests), from Debian in one apt-get call.
APT_PKGS=""
ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 || APT_PKGS="postgresql"
[ -x /usr/bin/chromium ] || APT_PKGS="$APT_PKGS chromium"
command -v prometheus >/dev/null || APT_PKGS="$APT_PKGS prometheus"  # the rules and dashboard tests
if [ -n "$APT_PKGS" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # shellcheck disable=SC2086
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $APT_PKGS >/dev/null) \
        || echo "warning: could not install ${APT_PKGS# }; their tests (PostgreSQL, admin UI, Prometheus) will be skipped"
fi
# PostgreSQL for the DB tests: a private server from the test harness (tests/harness/postgres.py, the
# same code the fault tests and benchmarks use), on a free loopback port unless LORAPLEX_TEST_PG_PORT
# says otherwise; stopped and deleted on exit. An already set LORAPLEX_TEST_POSTGRES_URL is used as is.
PG_DIR=""
harness() { PYTHONPATH=tests .venv/bin/python -m "$@"; }
cleanup() {
    if [ -n "$PG_DIR" ]; then harness harness.postgres stop "$PG_DIR" || true; fi
}
trap cleanup EXIT
if [ -z "${LORAPLEX_TEST_POSTGRES_URL:-}" ] && ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    pg=$(harness harness.postgres start ${LORAPLEX_TEST_PG_PORT:+--port "$LORAPLEX_TEST_PG_PORT"} --database loraplex_test)
    PG_DIR=$(sed -n 's/^DIR=//p' <<<"$pg")
    LORAPLEX_TEST_POSTGRES_URL=$(sed -n 's/^URL=//p' <<<"$pg")
    export LORAPLEX_TEST_POSTGRES_URL
fi

export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
# Bytecode for the repository's own modules (loraplex/, tests/, benchmarks/) and pytest's rewritten
# test modules, kept in the git-ignored __pycache__/ directories. Where PYTHONDONTWRITEBYTECODE=1 is
# set (this machine and many CI images) nothing was kept, so every xdist worker, every served
# process and every Ray worker compiled them again, and each worker rewrote the asserts of ~660
# modules: collecting the inner loop took 11.4 s per worker instead of 7.6 s.
unset PYTHONDONTWRITEBYTECODE
# Every Triton kernel compiles for sm_80 and sm_90 without spills or excess shared memory (no GPU
# needed). Only on a whole-suite run (no pytest arguments): a targeted run stays quick.
if [ "$#" -eq 0 ]; then
    phase triton-aot scripts/gpu-check.sh --aot
fi
# Three xdist workers on two cores: a third of the suite's wall time is tests waiting (Ray clusters
# starting, leases expiring, a soak's idle gaps, servers closing), and a third worker runs other
# tests meanwhile (quiet, same tree: pytest 958 s with three, ~1,000 s with two). Which tests share
# one is decided by tests/harness/xdist_groups.py (a module, the Ray tests, the demo model). Coverage on request only (LORAPLEX_TEST_COVERAGE=1): tracing made the
# in-process tests 20-50% slower here, and it does not see the servers started as subprocesses.
COV_ARGS=()
if [ "${LORAPLEX_TEST_COVERAGE:-0}" = 1 ]; then COV_ARGS=(--cov=loraplex --cov-report=term:skip-covered); fi
phase pytest .venv/bin/python -m pytest -q -n "${LORAPLEX_TEST_WORKERS:-3}" --dist loadscope --durations=30 ${COV_ARGS[@]+"${COV_ARGS[@]}"} "$@"
