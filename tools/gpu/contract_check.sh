#!/usr/bin/env bash
# One device call on a machine with one GPU (an H200): the cross-rank contract and the fault
# injection of issue 19. Expects DIR (default .carry-contract) from tools/gpu/stage_contract.sh.
#   gtest Faults.*        the CPU fault injection at the C/C++ ABI, here with a driver present
#   gtest Gpu.*           the one-GPU plugin tests against this build (copy, NCCL, fused)
#   rust contract         a skipped rank ends its peers with a timeout (every family, 2 and 4
#                         ranks); a graph keeps the group it captured, a replay after the release
#                         does nothing and reports it; two streams at once: one custom, one NCCL
#   rust simulated ranks  every family, type and rank count through Group::launch (bounds set)
#   rust self-test        the peer self-test (tests/gpu_selftest.rs): healthy 2/4/8 ranks, a
#                         dropped write named on every rank, garbled tokens, a rank never
#                         launched, a kernel past the host's deadline
#   sim_faults            every kernel family: skip, late, released, no bound, control
#   sim_ranks, sim_fused  --quick: the kernels with their waits bounded, no fault word written
#   memcheck              compute-sanitizer on the graph test (capture, release, replay) and on
#                         sim_faults --one-launch; no API error is expected, so none is hidden
#   racecheck             compute-sanitizer on sim_faults --one-launch: the waits' looks race-free
#   memcheck, racecheck   also on the self-test's sanitizer test (rust_gpu_selftest)
#   rust tuning file      a group uses the tuning file its process loaded (tests/gpu_tuning.rs)
#   memcheck              also on the multi-process setup through the runtime NCCL (issue 39),
#                         every rank process
#   gtest MultiProcessOneGpu.*  the multi-process path (IPC exchange, self-test verdicts gathered,
#                         NCCL fallback) with 2 and 4 rank processes on this one GPU, through the
#                         shared-memory stand-in NCCL (tests/cpp/shm_nccl.cpp): healthy groups; a
#                         dropped or garbled write, a kernel never launched (the test hook
#                         EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT) make every rank use NCCL with the
#                         line naming the pair; ranks with different tuning files use NCCL with the
#                         line naming them: A from `edgellm-allreduce-bench tune --mode sim`
#                         (TUNE_BENCH, default .carry-tune/edgellm-allreduce-bench, from
#                         stage_contract.sh; missing: that case is skipped, saying so), B = A with
#                         its first plain row's way changed
# Prints one PASS/FAIL line per step and "contract_check: PASS" or "FAIL"; logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath "${1:-.carry-contract}")
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
status=0
step() { # name, log, command...: runs it with its output in log, prints its verdict
  local name=$1 log=$2; shift 2
  if "$@" >"$OUT/$log" 2>&1; then echo "PASS $name"; else echo "FAIL $name (rc=$?, $OUT/$log)"; status=1; fi
  grep -E "^(PASS|FAIL) |passed|test result|HANG|panicked|ERROR SUMMARY|\[  (PASSED|FAILED) " "$OUT/$log" | grep -v "^PASS " | tail -4 | sed 's/^/    /'
}
for f in libNvInfer_edgellm_plugin.so.1 edgellm_plugin_tests_trt10 libedgellm_fake_nccl.so libedgellm_shm_nccl.so \
         libedgellm_shm_nccl_runtime.so rust_gpu_contract \
         rust_gpu_simulated_ranks rust_gpu_selftest rust_gpu_tuning sim_faults sim_ranks sim_fused; do
  [ -e "$dir/$f" ] || { echo "FAIL missing $dir/$f: run tools/gpu/stage_contract.sh first"; exit 2; }
done
nccl=$( (ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}'; find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null) | head -n1)
gtest() { # filter [NAME=VALUE...]
  local filter=$1; shift
  env "$@" EDGELLM_PLUGIN_PATH="$dir/libNvInfer_edgellm_plugin.so.1" EDGELLM_TEST_NCCL_LIBRARY="$nccl" \
    timeout 300 "$dir/edgellm_plugin_tests_trt10" --gtest_filter="$filter"; }
step "gtest Faults.* (fault injection at the ABI, driver present)" gtest_faults.log gtest 'Faults.*'
step "gtest Gpu.* (one GPU: copy, NCCL, fused, against this build)" gtest_gpu.log gtest 'Gpu.*:GpuFusedChain.*'
step "rust contract: skipped ranks, graph lifetime, two streams" rust_contract.log \
  timeout 300 "$dir/rust_gpu_contract" --ignored --test-threads 1 --nocapture
step "rust simulated ranks: every family, type and rank count (waits bounded)" rust_simulated.log \
  timeout 300 "$dir/rust_gpu_simulated_ranks" --ignored --test-threads 1 --nocapture
step "rust self-test: healthy, write lost, garbled, never launched, past the host's deadline" rust_selftest.log \
  timeout 300 "$dir/rust_gpu_selftest" --ignored --test-threads 1 --nocapture
step "rust tuning file: AUTO takes the loaded file's choice" rust_tuning.log \
  timeout 300 "$dir/rust_gpu_tuning" --ignored --nocapture
step "sim_faults: skip, late, released, no bound, control (every family, 2 and 4 ranks)" sim_faults.log \
  timeout 300 "$dir/sim_faults" --timeout 20
step "sim_ranks --quick: no wait gives up" sim_ranks.log timeout 300 "$dir/sim_ranks" --quick --no-timing --timeout 20
step "sim_fused --quick: no wait gives up" sim_fused.log timeout 300 "$dir/sim_fused" --quick --no-timing --timeout 20
# The multi-process path on this one GPU. Its tuning case needs two valid tuning files of this
# machine whose tables differ: A tuned here (sim, 2 ranks, fp32, plain, quick), B = A with the
# way of its first plain row changed (the row count stays, so B is as valid as A).
tune_bench=${TUNE_BENCH:-.carry-tune/edgellm-allreduce-bench}
tunings=()
if [ -x "$tune_bench" ]; then
  ta="$OUT/mp_tuning_a.txt" tb="$OUT/mp_tuning_b.txt"
  if timeout 300 "$tune_bench" tune --mode sim --ranks 2 --dtype fp32 --no-fused --quick --max-bytes 1M \
       --out "$ta" --csv "$OUT/mp_tune.csv" >"$OUT/mp_tune.log" 2>&1; then
    awk '!done && /^plain / { $NF = ($NF == "nccl" ? "oneshot" : "nccl"); done = 1 } { print }' "$ta" >"$tb"
    if cmp -s "$ta" "$tb"; then
      echo "FAIL no plain row to change in $ta"; status=1
    else
      tunings=(EDGELLM_TEST_TUNING_A="$ta" EDGELLM_TEST_TUNING_B="$tb")
    fi
  else
    echo "FAIL tune --mode sim for the tuning files ($OUT/mp_tune.log)"; status=1
  fi
else
  echo "SKIP the tuning case of MultiProcessOneGpu: no benchmark at $tune_bench (TUNE_BENCH, or stage_contract.sh's .carry-tune/)"
fi
step "gtest MultiProcessOneGpu.* (rank processes on one GPU: healthy, faults injected, tuning files)" gtest_mp_one_gpu.log \
  gtest 'ShmNccl.*:MultiProcessOneGpu.*' "${tunings[@]}"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
if [ -n "$san" ]; then
  step "memcheck: capture, release, replay (rust)" memcheck_graph.log timeout 300 "$san" --tool memcheck --error-exitcode 9 \
    "$dir/rust_gpu_contract" --ignored --exact a_replay_after_the_release_touches_only_live_memory --nocapture
  step "memcheck: sim_faults --one-launch" memcheck_sim_faults.log timeout 300 "$san" --tool memcheck --error-exitcode 9 \
    "$dir/sim_faults" --one-launch --timeout 120
  # Issue 39: the setup gathers through an NCCL on its own CUDA runtime, in every rank process
  # (a registration under the sanitizer takes seconds: the bound is raised).
  step "memcheck: multi-process setup through a runtime NCCL (every rank process)" memcheck_runtime_nccl.log \
    env EDGELLM_TEST_MP1_SETUP_BOUND_S=40 EDGELLM_PLUGIN_PATH="$dir/libNvInfer_edgellm_plugin.so.1" \
    timeout 400 "$san" --tool memcheck --target-processes all --error-exitcode 9 "$dir/edgellm_plugin_tests_trt10" \
    --gtest_filter='MultiProcessOneGpu.ARuntimeNccl*:MultiProcessOneGpu.AGatherThatFails*'
  # The looks of the bounded waits run here (skipped ranks wait past many looks): their shared
  # words must show no race.
  step "racecheck: sim_faults --one-launch" racecheck_sim_faults.log timeout 300 "$san" --tool racecheck --error-exitcode 9 \
    "$dir/sim_faults" --one-launch --timeout 120
  # The self-test's kernel: peers' workspaces, its host-mapped result block, nothing else.
  for tool in memcheck racecheck; do
    step "$tool: the peer self-test (rust)" "${tool}_selftest.log" timeout 300 "$san" --tool "$tool" --error-exitcode 9 \
      "$dir/rust_gpu_selftest" --ignored --exact under_a_sanitizer_the_self_test_touches_only_its_memory --nocapture
  done
else
  echo "FAIL no compute-sanitizer on this machine"; status=1
fi
[ $status = 0 ] && echo "contract_check: PASS" || echo "contract_check: FAIL"
exit $status
