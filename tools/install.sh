#!/usr/bin/env bash
# Builds libNvInfer_edgellm_plugin.so and installs the package (lib/, include/, lib/cmake/).
# Usage: tools/install.sh [--target aarch64-unknown-linux-gnu] [PREFIX]
#   (default PREFIX: <repo>/dist; for a cross build <repo>/dist-aarch64, built in build-aarch64)
# Installs what it needs first (tools/setup.sh): cmake and GoogleTest from apt, the CUDA 13.0
# compiler from PyPI, TensorRT headers from the trtx-sys crate; CUDA_HOME / TRT_ROOT are honoured.
# EDGELLM_TARGET=aarch64-unknown-linux-gnu is the same as --target: a cross build from x86-64
# with Debian's g++-aarch64-linux-gnu (on an aarch64 machine it is the plain native build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --target ]; then
  export EDGELLM_TARGET=${2:?--target needs a Rust target triple}
  shift 2
fi
target=${EDGELLM_TARGET:-}
[ "$target" = "$(uname -m)-unknown-linux-gnu" ] && target=
suffix=${target:+-${target%%-*}}
prefix=$(realpath -m "${1:-${EDGELLM_PREFIX:-$root/dist$suffix}}")
eval "$("$root/tools/setup.sh")"
build=${EDGELLM_BUILD_DIR:-$root/build$suffix}
args=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=$prefix")
[ -n "${EDGELLM_CUDA_ARCHS:-}" ] && args+=("-DEDGELLM_CUDA_ARCHS=$EDGELLM_CUDA_ARCHS")
if [ -n "$target" ]; then
  args+=("-DCMAKE_TOOLCHAIN_FILE=$root/cmake/toolchains/aarch64-linux-gnu.cmake"
    "-DEDGELLM_CUDART_STATIC=$EDGELLM_TARGET_CUDART_STATIC" "-DGTest_DIR=$EDGELLM_TARGET_GTEST_DIR")
fi
cmake -S "$root" -B "$build" "${args[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)"
cmake --install "$build" >/dev/null
echo "installed into $prefix: $(ls "$prefix/lib" | tr '\n' ' ')"
