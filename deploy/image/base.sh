#!/usr/bin/env bash
# The base image (Debian bookworm, minbase) made from Debian packages with mmdebstrap, imported into
# podman as $1 (default localhost/loraplex-base:bookworm): no container registry needed.
#   python3, python3-venv: the interpreter the venv is made from (3.11, as requirements.lock pins)
#   ca-certificates: TLS to the database, S3 and the hub
#   libtcmalloc-minimal4: the fast CPU runtime's allocator (Intel OpenMP comes from pip)
#   g++: the native CPU kernels compile on first use with -march=native for the CPU they run on
#   tini: PID 1 that forwards SIGTERM and reaps children
# BASE_EXTRA_PKGS adds packages (comma-separated): the CUDA image's base needs python3-dev (Triton
# builds its kernel launcher against Python's headers at run time).
# Run as root (mmdebstrap and podman import). `base.sh --packages` prints the suite and package list,
# which scripts/image.sh hashes into the tag: another list, another base image.
set -euo pipefail
TAG=${1:-localhost/loraplex-base:bookworm}
SUITE=${DEBIAN_SUITE:-bookworm}
PKGS=python3,python3-venv,ca-certificates,libtcmalloc-minimal4,g++,tini${BASE_EXTRA_PKGS:+,$BASE_EXTRA_PKGS}
if [ "$TAG" = --packages ]; then  # what decides the image (scripts/image.sh tags it by this)
    echo "$SUITE $PKGS"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mmdebstrap --quiet --variant=minbase --include="$PKGS" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$SUITE" "$tmp/rootfs.tar" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"}
podman import --change 'CMD ["/bin/bash"]' "$tmp/rootfs.tar" "$TAG" >/dev/null
echo "$TAG"
