#!/usr/bin/env bash
# One device call for issue 39 (a rank's CUDA context killed at the first setup gather when the
# registered NCCL reaches the GPU through a CUDA runtime of its own). Expects DIR (default
# .carry-contract) from tools/gpu/stage_contract.sh, and BASE_LIB (default
# DIR/base/libNvInfer_edgellm_plugin.so.1): the library before the fix.
#   repro      tools/gpu/setup_gather_repro.cpp, no library: 2 rank processes make three setup
#              gathers through libedgellm_shm_nccl_runtime.so in each way of handling the scratch
#              (pool as at 6d35dd5, pool read synchronously, plain per gather, kept for good)
#   gtest      MultiProcessOneGpu's issue-39 cases against BASE_LIB, then against this build
#   memcheck   compute-sanitizer on this build's runtime-NCCL cases (every child process)
# Prints a short table; logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath "${1:-.carry-contract}")
base=${BASE_LIB:-$dir/base/libNvInfer_edgellm_plugin.so.1}
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cuda=$(dirname "$(dirname "$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc | head -n1)")")
g++ -std=c++17 -O1 -I"$cuda/include" -Itests/cpp tools/gpu/setup_gather_repro.cpp -o /tmp/repro \
  -L"$cuda/lib64" -L"$cuda/lib64/stubs" -lcuda -lcudart_static -ldl -lrt -lpthread || { echo "FAIL repro build"; exit 2; }
echo "== repro: 2 rank processes, 3 gathers, then the application's cudaMalloc/cudaMemset/cudaMemcpy"
for variant in pool pool-syncread plain kept; do
  for round in 1 2 3; do
    f=/dev/shm/repro-$variant-$round; rm -f "$f"
    for r in 0 1; do timeout 60 /tmp/repro "$variant" 2 "$r" "$f" "$dir" >"$OUT/repro_${variant}_$round.$r.log" 2>&1 & done
    wait; rm -f "$f"
  done
  fails=$(cat "$OUT"/repro_"$variant"_*.log | grep -c "FAILED\|Terminated" || true)
  first=$(cat "$OUT"/repro_"$variant"_*.log | grep -v ": variant " | head -n1)
  echo "$variant: $fails of 6 rank processes failed${first:+; first: $first}"
done
cat "$OUT"/repro_*.log >"$OUT/repro_all.log" 2>/dev/null
cases='MultiProcessOneGpu.ARuntimeNccl*:MultiProcessOneGpu.AGatherThatFails*'
run() { # label, library, log, [sanitizer...]
  local label=$1 lib=$2 log=$3; shift 3
  env EDGELLM_PLUGIN_PATH="$lib" timeout 400 "$@" "$dir/edgellm_plugin_tests_trt10" --gtest_filter="$cases" >"$OUT/$log" 2>&1
  echo "$label: rc=$? $(grep -cE '^\[       OK \]' "$OUT/$log") ok, $(grep -cE '^\[  FAILED  \] MultiProcess' "$OUT/$log") failed"
  grep -E "registered \(exchange|shm-nccl \(runtime\)|after setup the|ERROR SUMMARY|did not finish" "$OUT/$log" | sort | uniq -c | head -12 | sed 's/^/    /'
}
echo "== gtest issue-39 cases"
[ -e "$base" ] && run "before the fix ($base)" "$base" gtest_issue39_base.log
run "this build" "$dir/libNvInfer_edgellm_plugin.so.1" gtest_issue39.log
san=$(command -v compute-sanitizer || ls "$cuda"/bin/compute-sanitizer 2>/dev/null | head -n1)
cases='MultiProcessOneGpu.ARuntimeNcclFormsTheGroup*:MultiProcessOneGpu.ARuntimeNcclWithARank*'
[ -n "$san" ] && run "this build under memcheck" "$dir/libNvInfer_edgellm_plugin.so.1" memcheck_issue39.log \
  "$san" --tool memcheck --target-processes all --error-exitcode 9
exit 0
