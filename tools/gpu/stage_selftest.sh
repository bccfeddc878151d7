#!/usr/bin/env bash
# Builds what tools/gpu/selftest_check.sh runs on a GPU machine into .carry-selftest/ (git-ignored;
# carry that folder): the Rust GPU test of the peer self-test (tests/gpu_selftest.rs), stripped.
# Needs the Rust build only (no CMake build, unlike stage_contract.sh). EDGELLM_CUDA_ARCHS
# defaults to 90 (the H200); CARGO_TARGET_DIR is honoured.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
eval "$("$root/tools/setup.sh")"
dest="$root/.carry-selftest"
rm -rf "$dest"
mkdir -p "$dest"
list=$(cd "$root" && EDGELLM_CUDA_ARCHS=${EDGELLM_CUDA_ARCHS:-90} cargo test --release --no-run --test gpu_selftest 2>&1) ||
  { echo "$list" | tail -30; exit 1; }
exe=$(grep -oP 'Executable tests/gpu_selftest.rs \(\K[^)]+' <<<"$list")
case "$exe" in /*) ;; *) exe="$root/$exe" ;; esac
cp "$exe" "$dest/rust_gpu_selftest"
strip "$dest/rust_gpu_selftest"
du -sh "$dest"
