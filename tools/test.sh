#!/usr/bin/env bash
# Builds and installs (tools/install.sh), then runs every test: the Rust tests of the library and
# the benchmark (cargo test --workspace)
# and, through ctest, the ABI check, the gtest suite against TensorRT 10 and 11 headers (GPU tests
# skip without a GPU), the kernel images of the library and the consumer project built against
# the installed prefix.
# Usage: tools/test.sh [--target aarch64-unknown-linux-gnu] [install.sh's options] [PREFIX]: a
# cross build's tests run under qemu-aarch64 (the library's Rust tests and the whole ctest suite;
# the benchmark and the ONNX pass are tested on the host build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = --target ]; then
    export EDGELLM_TARGET=${2:?--target needs a Rust target triple}
    shift 2
  else
    args+=("$1")
    shift
  fi
done
"$root/tools/install.sh" "${args[@]}"
eval "$("$root/tools/setup.sh")"
cd "$root"
target=${EDGELLM_TARGET:-}
[ "$target" = "$(uname -m)-unknown-linux-gnu" ] && target=
build=${EDGELLM_BUILD_DIR:-$root/build${target:+-${target%%-*}}}
cached() { grep -oP "^$1:[A-Z]+=\K.*" "$build/CMakeCache.txt"; }
# The same kernel targets (and cross compilers: cargo-cross.env) as the CMake build, so cargo
# reuses its build.
archs=$(cached EDGELLM_CUDA_ARCHS)
if [ -z "$target" ]; then
  EDGELLM_CUDA_ARCHS=${archs//;/,} cargo test --release --workspace
else
  triple=${target//-/_}
  qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64)
  mapfile -t cross <"$build/cargo-cross.env"
  env "${cross[@]}" "CARGO_TARGET_${triple^^}_RUNNER=$qemu -L /usr/aarch64-linux-gnu" \
    EDGELLM_CUDA_ARCHS="${archs//;/,}" cargo test --release --target "$target" -p edgellm-allreduce
fi
ctest --test-dir "$build" --output-on-failure
