# Sourced by .ci/run and scripts/test.sh: `phase NAME CMD...` runs CMD and prints its wall time, so a
# CI log says which phase a slow run lost its time in. CMD's exit status is phase's.
phase() {
    local name=$1 start=$SECONDS rc=0
    shift
    "$@" || rc=$?
    echo "phase: $name took $((SECONDS - start))s (exit $rc)" >&2
    return "$rc"
}
