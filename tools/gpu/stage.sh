#!/usr/bin/env bash
# Copies what the GPU machine runs into .carry/ (git-ignored), stripped: the built library, the
# gtest binaries with their stand-in libnvinfer (trt10/, trt11/) and the stand-in NCCL of the
# fault tests (beside them), the Rust GPU test binaries (simulated ranks, peer self-test), the benchmark, the two kernel
# simulations, the NVLink probe and the two-shot stage timings (tools/gpu/device_session.sh
# runs them); and into .carry-overlay/ the library, the overlay tests with their stand-ins and
# Edge-LLM 0.11's own library for TensorRT 10 and 11 (tools/gpu/overlay_check.sh runs them; a
# call of its own, as both folders together pass the device's 64 MiB). Run after
# tools/install.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
eval "$("$root/tools/setup.sh")"
overlay="$root/.carry-overlay"
mkdir -p "$root/.carry" "$overlay"
cp -L "$root/build/libNvInfer_edgellm_plugin.so.1" "$root/build"/tests/edgellm_plugin_tests_trt* \
  "$root/build/tests/libedgellm_fake_nccl.so" "$root/.carry/"
cp -L "$root/build/libNvInfer_edgellm_plugin.so.1" "$root/build"/tests/edgellm_overlay_tests_trt* "$overlay/"
for major in 10 11; do
  for dest in "$root/.carry" "$overlay"; do
    mkdir -p "$dest/trt$major" && cp -L "$root/build/tests/trt$major/libnvinfer.so.$major" "$dest/trt$major/"
  done
  mkdir -p "$overlay/edgellm-trt$major"
  eval "$(EDGELLM_TRT_MAJOR=$major "$root/tools/edgellm_base.sh")"
  cp "$EDGELLM_BASE_LIBRARY" "$overlay/edgellm-trt$major/libNvInfer_edgellm_plugin_base.so"
done
archs=$(grep -oP '^EDGELLM_CUDA_ARCHS:STRING=\K.*' "$root/build/CMakeCache.txt")
rust_tests=$(cd "$root" && EDGELLM_CUDA_ARCHS=${archs//;/,} cargo test --release --no-run 2>&1)
for test in gpu_simulated_ranks gpu_selftest; do
  cp "$root/$(grep -oP "Executable tests/$test.rs \(\K[^)]+" <<<"$rust_tests")" "$root/.carry/rust_$test"
done
(cd "$root" && EDGELLM_CUDA_ARCHS=${archs//;/,} cargo build --release -q -p edgellm-allreduce-bench)
cp "$root/target/release/edgellm-allreduce-bench" "$root/.carry/"
for sim in sim_ranks sim_fused; do
  SIM_NAME=$sim SIM_OUT="$root/.carry" SIM_BUILD_ONLY=1 "$root/tests/gpu/kernels/build_and_run.sh"
done
# The NVLink ceiling probe (2+ GPUs): push, pull, copy engine, TMA, one way and both ways.
"$CUDA_HOME/bin/nvcc" -O3 -std=c++17 -arch=sm_90 -L"$CUDA_HOME/lib" -Werror all-warnings \
  "$root/tools/gpu/nvlink_probe.cu" -o "$root/.carry/nvlink_probe"
# The 4+ rank two-shot's stages on simulated ranks (docs/PERFORMANCE.md, "Four and eight ranks").
"$CUDA_HOME/bin/nvcc" -O3 -std=c++17 -arch=sm_90 -L"$CUDA_HOME/lib" -Werror all-warnings \
  "$root/tools/gpu/twoshot_stages.cu" -o "$root/.carry/twoshot_stages"
# The Lamport one-shot beside stripped kernels at decode sizes (docs/PERFORMANCE.md, issue 42).
"$CUDA_HOME/bin/nvcc" -O3 -std=c++17 -arch=sm_90 -L"$CUDA_HOME/lib" -Werror all-warnings \
  "$root/tools/gpu/lamport_stages.cu" -o "$root/.carry/lamport_stages"
strip "$root/.carry"/edgellm_plugin_tests_trt* "$root/.carry/rust_gpu_simulated_ranks" "$root/.carry/rust_gpu_selftest" \
  "$root/.carry/edgellm-allreduce-bench" "$overlay"/edgellm_overlay_tests_trt*
du -sh "$root/.carry" "$overlay"
