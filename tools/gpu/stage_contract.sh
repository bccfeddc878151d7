#!/usr/bin/env bash
# Builds what tools/gpu/contract_check.sh runs on a GPU machine (the cross-rank contract: bounded
# waits, faults, graph lifetimes, streams, input hardening) into .carry-contract/ (git-ignored;
# carry that folder): the library and the gtest binary (TensorRT 10 build, with its stand-in
# libnvinfer, the stand-in NCCL of the fault tests, and the shared-memory stand-in NCCL whose
# ranks are processes on one GPU: MultiProcessOneGpu.*), the Rust GPU tests (contract, simulated
# ranks, peer self-test, tuning file), and the kernel simulations (faults, plain, fused); and the benchmark
# into .carry-tune/ (tune_check.sh; contract_check.sh makes its tuning files with it). Run after
# tools/install.sh.
# BENCH=1 also stages .carry-contract-bench/ (a carry of its own): edgellm-allreduce-bench of
# this tree and of BASE (default aa6094a, main before the contract, built from `git archive` in a temporary folder), for
# tools/gpu/contract_bench.sh (a device call of its own).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
eval "$("$root/tools/setup.sh")"
dest="$root/.carry-contract"
rm -rf "$dest"
mkdir -p "$dest/trt10"
archs=$(grep -oP '^EDGELLM_CUDA_ARCHS:STRING=\K.*' "$root/build/CMakeCache.txt")
cp -L "$root/build/libNvInfer_edgellm_plugin.so.1" "$root/build/tests/edgellm_plugin_tests_trt10" \
  "$root/build/tests/libedgellm_fake_nccl.so" "$root/build/tests/libedgellm_shm_nccl.so" \
  "$root/build/tests/libedgellm_shm_nccl_runtime.so" "$dest/"
cp -L "$root/build/tests/trt10/libnvinfer.so.10" "$dest/trt10/"
list=$(cd "$root" && EDGELLM_CUDA_ARCHS=${archs//;/,} cargo test --release --no-run --test gpu_contract --test gpu_simulated_ranks --test gpu_selftest --test gpu_tuning 2>&1)
for test in gpu_contract gpu_simulated_ranks gpu_selftest gpu_tuning; do
  cp "$root/$(grep -oP "Executable tests/$test.rs \(\K[^)]+" <<<"$list")" "$dest/rust_$test"
done
for sim in sim_faults sim_ranks sim_fused; do
  SIM_NAME=$sim SIM_OUT="$dest" SIM_BUILD_ONLY=1 "$root/tests/gpu/kernels/build_and_run.sh"
done
# The benchmark into .carry-tune/, for tools/gpu/tune_check.sh (tune --mode sim, then AUTO with the
# file) and the tuning files of contract_check.sh's multi-process step.
(cd "$root" && EDGELLM_CUDA_ARCHS=${archs//;/,} cargo build --release -q -p edgellm-allreduce-bench)
rm -rf "$root/.carry-tune" && mkdir -p "$root/.carry-tune"  # a carry of its own (64 MiB a call)
cp "$root/target/release/edgellm-allreduce-bench" "$root/.carry-tune/"
strip "$dest"/edgellm_plugin_tests_trt10 "$dest"/rust_* "$root/.carry-tune/edgellm-allreduce-bench"
du -sh "$dest"
if [ "${BENCH:-0}" = 1 ]; then
  base=${BASE:-aa6094a}
  bench="$root/.carry-contract-bench"
  rm -rf "$bench" && mkdir -p "$bench"
  (cd "$root" && EDGELLM_CUDA_ARCHS=${archs//;/,} cargo build --release -q -p edgellm-allreduce-bench)
  cp "$root/target/release/edgellm-allreduce-bench" "$bench/bench-$(git -C "$root" rev-parse --short HEAD)"
  tree=$(mktemp -d)
  git -C "$root" archive "$base" | tar -x -C "$tree"
  (cd "$tree" && EDGELLM_CUDA_ARCHS=${archs//;/,} CARGO_TARGET_DIR="$root/target/base-$base" \
    cargo build --release -q -p edgellm-allreduce-bench)
  cp "$root/target/base-$base/release/edgellm-allreduce-bench" "$bench/bench-$base"
  rm -rf "$tree"
  strip "$bench"/bench-*
  du -sh "$bench"
fi
