#!/usr/bin/env bash
# Build the loraplex image, run it, talk to it, stop it: what CI runs (.ci/run), from a fresh
# Debian machine, as root. Steps (each timed, `phase: NAME took Ns`):
#   tools     podman, runc and mmdebstrap from Debian (skipped when present)
#   base      the Debian base image made with mmdebstrap (deploy/image/base.sh; reused while
#             its package list is unchanged: the tag carries the list's hash)
#   build     `podman build` of ./Containerfile from the tracked files (+ this machine's pip set-up
#             when it has one: its CA bundle and the local CPU torch wheel, staged in _build/)
#   size      the image must stay under LORAPLEX_IMAGE_BUDGET_MB (default 3800)
#   run       the image started with --network host on a free loopback port; an OpenAI chat
#             completion with the demo key it prints; a stream interrupted by SIGTERM must finish
#             whole ([DONE]) and the container must exit 0 (deploy/image/smoke.py)
# Usage: scripts/image.sh [--build-only]    env: LORAPLEX_IMAGE (tag), LORAPLEX_IMAGE_BUDGET_MB
# Podman settings this machine type needs (MACHINE-NOTES "Containers"): runc with cgroupfs (crun
# refuses the hybrid cgroups here), no default ulimits (setrlimit fails), host networking for the
# build's pip. They go into a containers.conf of this run (CONTAINERS_CONF), not into /etc.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phase.sh
IMAGE=${LORAPLEX_IMAGE:-localhost/loraplex:dev}
BUDGET_MB=${LORAPLEX_IMAGE_BUDGET_MB:-3800}
BUILD_ONLY=0
[ "${1:-}" = --build-only ] && BUILD_ONLY=1

work=$(mktemp -d /tmp/loraplex-image.XXXXXX)
smoke_container="loraplex-smoke-$$"  # not "name": phase() has a local of that name
cleanup() {
    podman rm -f "$smoke_container" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

install_tools() {
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing+=(runc)
    command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
    if [ "${#missing[@]}" -gt 0 ]; then
        [ "$(id -u)" = 0 ] || { echo "image.sh: install ${missing[*]} (apt) or run as root" >&2; exit 2; }
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}
phase tools install_tools

printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' >"$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"
PODMAN=(podman --runtime runc)

base_tag="localhost/loraplex-base:bookworm-$(deploy/image/base.sh --packages | sha256sum | cut -c1-12)"
make_base() {
    if "${PODMAN[@]}" image exists "$base_tag"; then
        echo "base image $base_tag exists"
    else
        deploy/image/base.sh "$base_tag"
    fi
}
phase base make_base

# The build context: the files git tracks (a fresh clone's, also uncommitted edits to them), plus
# _build/ with the pip set-up. pip's own settings on the build machine are honoured when present —
# a CA bundle (PIP_CERT / pip config `cert`: a TLS-inspecting proxy's CA) and a find-links folder
# holding the torch CPU wheel the lock pins; elsewhere torch comes from the PyTorch CPU index.
stage_context() {
    local ctx="$work/context"
    mkdir -p "$ctx/_build/wheels"
    # (files deleted but not yet committed are skipped: --ignore-failed-read)
    git ls-files -z --cached --others --exclude-standard \
        | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$ctx" || return
    local torch_pin cert links env="$ctx/_build/pip-env.sh"
    torch_pin=$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' requirements.lock)
    cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
    links=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
    : >"$env"
    if [ -n "$cert" ] && [ -f "$cert" ]; then
        cp "$cert" "$ctx/_build/ca.crt"
        echo 'export PIP_CERT=/build/ca.crt' >>"$env"
        echo "context: pip CA bundle from $cert"
    fi
    local wheel=""
    for dir in $links; do
        wheel=$(compgen -G "$dir/torch-${torch_pin}-*.whl" | head -1 || true)
        [ -n "$wheel" ] && break
    done
    if [ -n "$wheel" ]; then
        cp "$wheel" "$ctx/_build/wheels/" || return
        echo 'export PIP_FIND_LINKS=/build/wheels' >>"$env"
        echo "context: $(basename "$wheel") from $(dirname "$wheel")"
    else
        echo 'export PIP_EXTRA_INDEX_URL="${TORCH_INDEX}"' >>"$env"
        echo "context: torch==$torch_pin from the PyTorch CPU index"
    fi
}
phase context stage_context

build() {
    "${PODMAN[@]}" build --format docker --network host --build-arg "BASE=$base_tag" \
        -t "$IMAGE" -f "$work/context/Containerfile" "$work/context"
}
phase build build

check_size() {
    local bytes mb
    bytes=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
    mb=$((bytes / 1024 / 1024))
    echo "image $IMAGE: ${mb} MiB (budget ${BUDGET_MB} MiB)"
    if [ "$mb" -gt "$BUDGET_MB" ]; then
        echo "image.sh: the image is over its size budget" >&2
        exit 1
    fi
}
phase size check_size
[ "$BUILD_ONLY" = 1 ] && exit 0

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run_image() {
    # k8s-file: `podman logs` works where journald does not run (the demo key is read from the log)
    "${PODMAN[@]}" run -d --name "$smoke_container" --network host --log-driver k8s-file \
        -e LORAPLEX_SERVER__HOST=127.0.0.1 -e LORAPLEX_SERVER__PORT="$port" "$IMAGE" >/dev/null
    python3 deploy/image/smoke.py --url "http://127.0.0.1:$port" --container "$smoke_container" || return
    # SIGTERM drained: the exit status of `loraplex serve` after the drain is 0
    local status
    status=$("${PODMAN[@]}" wait "$smoke_container")
    echo "container exit status: $status"
    if [ "$status" != 0 ]; then
        "${PODMAN[@]}" logs --tail 60 "$smoke_container" >&2 || true
        exit 1
    fi
}
phase run run_image
echo "image.sh: $IMAGE built, answered and drained"
