#!/usr/bin/env bash
# One device call: the gtest suite, the library's launch path on simulated ranks (Rust), both
# kernel simulations (full), and compute-sanitizer on the quick simulation. Expects .carry/ from
# tools/gpu/stage.sh. Logs under $OUT. Exits non-zero when any step fails (a missing artefact
# too); the last line counts the steps: "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_NVLS_ENABLE=0
passed=0; failed=()
# step NAME COMMAND...: runs it, prints its exit status, records the outcome.
step() {
  local name=$1; shift
  echo "== $name"
  "$@"; local rc=$?
  echo "rc=$rc"
  if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else failed+=("$name (rc=$rc)"); fi
}
need() { [ -x "$1" ] || { echo "missing $1: run tools/gpu/stage.sh first"; return 2; }; }

gtest() { tools/gpu/run_gpu_tests.sh .carry 2>&1 | tee "$OUT/gtest.txt"; }
step "gtest suite" gtest

rust_gpu() {
  need .carry/rust_gpu_simulated_ranks || return
  timeout 300 .carry/rust_gpu_simulated_ranks --ignored --nocapture --test-threads 1 >"$OUT/rust_gpu.log" 2>&1; local rc=$?
  grep -E "cases passed|test result|panicked|HANG" "$OUT/rust_gpu.log" | head
  return $rc
}
step "Rust: the library's launch path on simulated ranks" rust_gpu

sim() { # sim NAME LOG [ARGS...]: a kernel simulation, its failures and timings
  local name=$1 log=$2; shift 2
  need ".carry/$name" || return
  timeout "${SIM_LIMIT:-300}" ".carry/$name" --timeout 20 "$@" >"$OUT/$log" 2>&1; local rc=$?
  grep -E "^FAIL|HANG|passed" "$OUT/$log" | head -20; grep -E "^TIME|median|us " "$OUT/$log" | head -40
  return $rc
}
[ "${SKIP_FUSED:-0}" = 1 ] || step "fused kernel simulation (full)" sim sim_fused sim_fused.log
if [ "${SKIP_SIM:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  step "kernel simulation (full)" sim sim_ranks sim_full.log ${SIM_ARGS:-}
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
  sanitize() { # one launch for all ranks: the sanitizer serializes kernels
    [ -n "$san" ] || { echo "no compute-sanitizer on this machine"; return 2; }
    need .carry/sim_ranks || return
    timeout "${SAN_LIMIT:-300}" "$san" --tool "$1" --error-exitcode 9 .carry/sim_ranks --quick --one-launch --no-timing --timeout 120 \
      >"$OUT/san_$1.log" 2>&1; local rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" "$OUT/san_$1.log" | tail -3
    return $rc
  }
  for tool in ${SAN_TOOLS:-memcheck synccheck racecheck}; do
    step "compute-sanitizer --tool $tool (quick, one launch)" sanitize "$tool"
  done
fi

for f in "${failed[@]}"; do echo "FAILED: $f"; done
echo "device session: ${passed} passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
