#!/usr/bin/env bash
# One device call of benchmarks: edgellm-allreduce-bench (real ranks when there are 2+ GPUs, and
# simulated ranks), plus PyTorch/NCCL anchors (nccl_symm_bench.py from the shared folder) when
# asked. Expects .carry/ (tools/gpu/stage.sh, the bench binary, nccl_symm_bench.py). Logs in $OUT.
# Exits non-zero when any run fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=.carry/edgellm-allreduce-bench
[ -x "$B" ] || { echo "missing $B: build it (cargo build --release -p edgellm-allreduce-bench) and copy it to .carry/"; exit 2; }
gpus=$(nvidia-smi -L | wc -l)
nccl=$( (ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}') | head -n1)
status=0
ran() { local rc=$1; echo "rc=$rc"; [ "$rc" -eq 0 ] || status=1; }
if [ "$gpus" -ge 2 ] && [ "${REAL:-1}" = 1 ]; then
  echo "== bench real ($gpus GPUs) ${REAL_ARGS:-}"
  # shellcheck disable=SC2086
  timeout "${REAL_LIMIT:-280}" $B --mode real --nccl-lib "$nccl" ${REAL_ARGS:-} --csv "$OUT/real.csv" --plot "$OUT/real.png" \
    >"$OUT/real.txt" 2>"$OUT/real.err"; ran $?; cat "$OUT/real.txt"; tail -5 "$OUT/real.err"
fi
if [ -n "${FUSED_ARGS:-}" ]; then
  for mode in ${FUSED_MODES:-real sim}; do
    echo "== fused $mode $FUSED_ARGS"
    # shellcheck disable=SC2086
    timeout 200 $B --mode "$mode" --nccl-lib "$nccl" $FUSED_ARGS --csv "$OUT/fused_$mode.csv" --no-plot \
      >"$OUT/fused_$mode.txt" 2>"$OUT/fused_$mode.err"; ran $?; cat "$OUT/fused_$mode.txt"; tail -3 "$OUT/fused_$mode.err"
  done
fi
if [ "${SIM:-1}" = 1 ]; then
  echo "== bench sim ${SIM_ARGS:-}"
  # shellcheck disable=SC2086
  timeout "${SIM_LIMIT:-280}" $B --mode sim ${SIM_ARGS:-} --csv "$OUT/sim.csv" --plot "$OUT/sim.png" \
    >"$OUT/sim.txt" 2>"$OUT/sim.err"; ran $?; cat "$OUT/sim.txt"; tail -5 "$OUT/sim.err"
fi
if [ "${TORCH:-0}" = 1 ] && [ "$gpus" -ge 2 ]; then
  echo "== nccl_symm_bench.py (PyTorch + NCCL anchors)"
  timeout 240 torchrun --nproc-per-node="$gpus" .carry/nccl_symm_bench.py >"$OUT/torch.txt" 2>&1; ran $?; tail -14 "$OUT/torch.txt"
fi
exit $status
