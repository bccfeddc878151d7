#!/usr/bin/env bash
# One device call on a machine with an sm_90 GPU (H100/H200): what a GPU without a matching kernel
# image gets. Expects DIR (default .carry/kernel-images) from tools/gpu/stage_no_image.sh.
#   none: the plain paths run (copy, NCCL: the Gpu gtests), the fused op fails at configure time
#         (NoKernelImage gtest), no group forms, and the library says why in exactly one warning;
#   jit:  the compute_80 PTX is JIT-compiled: every Gpu gtest and the kernel families on
#         simulated ranks give correct results, with PDL off.
# Prints one line per step and "no_image_check: PASS" or "FAIL"; logs go to $OUT (or DIR).
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath "${1:-.carry/kernel-images}")
out=${OUT:-$dir}
mkdir -p "$out/none" "$out/jit"
# The two libraries were built around sm_90: on another GPU (or none) the checks mean nothing.
cc=$(nvidia-smi -i 0 --query-gpu=compute_cap --format=csv,noheader 2>/dev/null)
[ "$cc" = 9.0 ] || { echo "no_image_check: needs an sm_90 GPU as device 0 (found: '${cc:-none}')"; exit 2; }
status=0
logged() { # log, command...: runs the command with its output in log (the verdict stays on stdout)
  local log=$1; shift
  "$@" >"$log" 2>&1
}
step() { # name, command...: runs it, prints its verdict
  local name=$1; shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name"; status=1; fi
}
export CUDA_CACHE_MAXSIZE=1073741824  # keep the JIT output for the later steps

echo "== none: $(cat "$dir/none/IMAGES")"
step "gtest: copy and NCCL paths, fused op refused at configure time" env EDGELLM_TEST_EXPECT_NO_KERNEL_IMAGE=1 \
  GTEST_FILTER='Gpu.*:NoKernelImage.*:-Gpu.FusedResidualRmsNormOneRank' OUT="$out/none" \
  timeout 300 tools/gpu/run_gpu_tests.sh "$dir/none"
grep -E '^\[ +(OK|FAILED|SKIPPED) +\] NoKernelImage' "$out/none/edgellm_plugin_tests_trt10.log"
warnings=$(grep -cE '^\[edgellm-allreduce\] device [0-9]+ \(sm_[0-9]+\): no kernel image' "$out/none/edgellm_plugin_tests_trt10.log")
grep -m1 -E '^\[edgellm-allreduce\] device [0-9]+ \(sm_[0-9]+\): no kernel image' "$out/none/edgellm_plugin_tests_trt10.log"
step "exactly one no-image warning (got $warnings)" test "$warnings" = 1
step "rust: kernels report no image, no group forms, norm refused" logged "$out/none/rust_gpu_kernel_images.log" \
  env EDGELLM_TEST_EXPECT_KERNELS=none timeout 300 "$dir/none/rust_gpu_kernel_images" --ignored --nocapture

echo "== jit: $(cat "$dir/jit/IMAGES")"
step "rust: every kernel loads from compute_80 PTX, PDL off" logged "$out/jit/rust_gpu_kernel_images.log" \
  env EDGELLM_TEST_EXPECT_KERNELS=jit timeout 300 "$dir/jit/rust_gpu_kernel_images" --ignored --nocapture
grep -m1 '^images' "$out/jit/rust_gpu_kernel_images.log"
step "gtest: every Gpu test against the JIT-compiled kernels" env GTEST_FILTER='Gpu.*' OUT="$out/jit" \
  timeout 300 tools/gpu/run_gpu_tests.sh "$dir/jit"
step "rust: every family, type and rank count on simulated ranks (JIT-compiled)" logged "$out/jit/rust_gpu_simulated_ranks.log" \
  timeout 300 "$dir/jit/rust_gpu_simulated_ranks" --ignored --nocapture --test-threads 1
grep -E "cases passed|test result" "$out/jit/rust_gpu_simulated_ranks.log" | head -3

[ $status = 0 ] && echo "no_image_check: PASS" || echo "no_image_check: FAIL"
exit $status
