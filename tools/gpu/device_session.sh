#!/usr/bin/env bash
# One device call: the gtest suite, the kernel simulation (full), and compute-sanitizer on the
# quick simulation. Expects .carry/ from tools/gpu/stage.sh (+ sim_ranks). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_NVLS_ENABLE=0
echo "== gtest suite"
tools/gpu/run_gpu_tests.sh .carry 2>&1 | tee "$OUT/gtest.txt"
echo "== overlay: Edge-LLM 0.11's own library as the base"
tools/gpu/overlay_check.sh .carry 2>&1 | tee "$OUT/overlay.txt"
echo "== Rust: the library's launch path on simulated ranks"
timeout 300 .carry/rust_gpu_simulated_ranks --nocapture --test-threads 1 >"$OUT/rust_gpu.log" 2>&1
echo "rc=$?"; grep -E "cases passed|test result|panicked|HANG" "$OUT/rust_gpu.log" | head
if [ -x .carry/sim_fused ] && [ "${SKIP_FUSED:-0}" != 1 ]; then
  echo "== fused kernel simulation (full)"
  timeout "${SIM_LIMIT:-300}" .carry/sim_fused --timeout 20 >"$OUT/sim_fused.log" 2>&1
  echo "rc=$?"; grep -E "^FAIL|HANG|passed" "$OUT/sim_fused.log" | head -20; grep -E "^TIME" "$OUT/sim_fused.log" | head -40
fi
if [ -x .carry/sim_ranks ] && [ "${SKIP_SIM:-0}" != 1 ]; then
  echo "== kernel simulation (full)"
  timeout "${SIM_LIMIT:-300}" .carry/sim_ranks --timeout 20 ${SIM_ARGS:-} >"$OUT/sim_full.log" 2>&1
  echo "rc=$?"; grep -E "FAIL|HANG|passed" "$OUT/sim_full.log" | head -20; grep -iE "median|us " "$OUT/sim_full.log" | tail -30
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
  for tool in ${SAN_TOOLS:-memcheck synccheck racecheck}; do
    echo "== compute-sanitizer --tool $tool (quick, one launch)"
    timeout 150 "$san" --tool "$tool" --error-exitcode 9 .carry/sim_ranks --quick --one-launch --no-timing --timeout 120 \
      >"$OUT/san_$tool.log" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" "$OUT/san_$tool.log" | tail -3
  done
fi
