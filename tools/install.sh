#!/usr/bin/env bash
# Builds libNvInfer_edgellm_plugin.so and installs the package (lib/, include/, lib/cmake/).
# Usage: tools/install.sh [PREFIX]     (default PREFIX: <repo>/dist)
# Installs what it needs first (tools/setup.sh): cmake and GoogleTest from apt, the CUDA 13.0
# compiler from PyPI, TensorRT headers from the trtx-sys crate; CUDA_HOME / TRT_ROOT are honoured.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(realpath -m "${1:-${EDGELLM_PREFIX:-$root/dist}}")
eval "$("$root/tools/setup.sh")"
build=${EDGELLM_BUILD_DIR:-$root/build}
args=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=$prefix")
[ -n "${EDGELLM_CUDA_ARCHS:-}" ] && args+=("-DEDGELLM_CUDA_ARCHS=$EDGELLM_CUDA_ARCHS")
cmake -S "$root" -B "$build" "${args[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)"
cmake --install "$build" >/dev/null
echo "installed into $prefix: $(ls "$prefix/lib" | tr '\n' ' ')"
