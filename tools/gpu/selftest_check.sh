#!/usr/bin/env bash
# One device call on a machine with one GPU (an H200): the peer self-test (kernels/selftest.cu,
# src/group/selftest.rs) on simulated ranks. Expects DIR (default .carry-selftest) from
# tools/gpu/stage_selftest.sh:
#   run(command="tools/gpu/selftest_check.sh", carry=[".carry-selftest"])
#   rust self-test   tests/gpu_selftest.rs: a healthy group of 2, 4, 8 ranks passes (and its
#                    all-reduces stay correct); a dropped write is "write lost" naming the pair
#                    on every rank; garbled tokens; a rank never launched is named and the others
#                    end within the bound; a kernel past the host's deadline is reported and its
#                    group retired
#   memcheck         compute-sanitizer on under_a_sanitizer_the_self_test_touches_only_its_memory
#   racecheck        the same
# Prints one PASS/FAIL line per step and "selftest_check: PASS" or "FAIL"; logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath "${1:-.carry-selftest}")
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -x "$dir/rust_gpu_selftest" ] || { echo "FAIL missing $dir/rust_gpu_selftest: run tools/gpu/stage_selftest.sh first"; exit 2; }
status=0
step() { # name, log, command...: runs it with its output in log, prints its verdict
  local name=$1 log=$2; shift 2
  if "$@" >"$OUT/$log" 2>&1; then echo "PASS $name"; else echo "FAIL $name (rc=$?, $OUT/$log)"; status=1; fi
  grep -E "^test |passed in|failed in|test result|HANG|panicked|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$log" | tail -16 | sed 's/^/    /'
}
step "rust self-test: healthy, write lost, garbled, never launched, past the host's deadline" selftest.log \
  timeout 300 "$dir/rust_gpu_selftest" --ignored --test-threads 1 --nocapture
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
if [ -n "$san" ]; then
  for tool in memcheck racecheck; do
    step "$tool: the self-test's kernel" "selftest_$tool.log" timeout 300 "$san" --tool "$tool" --error-exitcode 9 \
      "$dir/rust_gpu_selftest" --ignored --exact under_a_sanitizer_the_self_test_touches_only_its_memory --nocapture
  done
else
  echo "FAIL no compute-sanitizer on this machine"; status=1
fi
[ $status = 0 ] && echo "selftest_check: PASS" || echo "selftest_check: FAIL"
exit $status
