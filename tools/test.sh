#!/usr/bin/env bash
# Builds and installs (tools/install.sh), then runs every test: the Rust tests of the library and
# the benchmark (cargo test --workspace)
# and, through ctest, the ABI check, the gtest suite against TensorRT 10 and 11 headers (GPU tests
# skip without a GPU) and the consumer project built against the installed prefix.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tools/install.sh" "$@"
eval "$("$root/tools/setup.sh")"
cd "$root"
# The same kernel targets as the CMake build, so cargo reuses its build instead of recompiling.
archs=$(grep -oP '^EDGELLM_CUDA_ARCHS:STRING=\K.*' "${EDGELLM_BUILD_DIR:-$root/build}/CMakeCache.txt")
EDGELLM_CUDA_ARCHS=${archs//;/,} cargo test --release --workspace
ctest --test-dir "${EDGELLM_BUILD_DIR:-$root/build}" --output-on-failure
