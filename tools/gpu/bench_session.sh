#!/usr/bin/env bash
# One device call of benchmarks: edgellm-allreduce-bench (real ranks when there are 2+ GPUs, and
# simulated ranks), plus PyTorch/NCCL anchors (nccl_symm_bench.py from the shared folder) when
# asked. Expects .carry/ (tools/gpu/stage.sh, the bench binary, nccl_symm_bench.py). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=.carry/edgellm-allreduce-bench
gpus=$(nvidia-smi -L | wc -l)
nccl=$( (ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}') | head -n1)
if [ "$gpus" -ge 2 ] && [ "${REAL:-1}" = 1 ]; then
  echo "== bench real ($gpus GPUs) ${REAL_ARGS:-}"
  timeout "${REAL_LIMIT:-280}" $B --mode real --nccl-lib "$nccl" ${REAL_ARGS:-} --csv "$OUT/real.csv" --plot "$OUT/real.png" \
    >"$OUT/real.txt" 2>"$OUT/real.err"; echo "rc=$?"; cat "$OUT/real.txt"; tail -5 "$OUT/real.err"
fi
if [ -n "${ABLATE_ARGS:-}" ] && [ "$gpus" -ge 2 ]; then
  ablate_env=${ABLATE_ENV:-EDGELLM_ALLREDUCE_PDL=0}
  echo "== ablation: $ablate_env $ABLATE_ARGS"
  env $ablate_env timeout 150 $B --mode real --nccl-lib "$nccl" $ABLATE_ARGS --csv "$OUT/real_ablation.csv" \
    >"$OUT/real_ablation.txt" 2>&1; echo "rc=$?"; grep -A12 "size " "$OUT/real_ablation.txt" | head -14
fi
if [ -n "${FUSED_ARGS:-}" ]; then
  for mode in ${FUSED_MODES:-real sim}; do
    echo "== fused $mode $FUSED_ARGS"
    timeout 200 $B --mode "$mode" --nccl-lib "$nccl" $FUSED_ARGS --csv "$OUT/fused_$mode.csv" --no-plot \
      >"$OUT/fused_$mode.txt" 2>"$OUT/fused_$mode.err"; echo "rc=$?"; cat "$OUT/fused_$mode.txt"; tail -3 "$OUT/fused_$mode.err"
  done
fi
if [ "${SIM:-1}" = 1 ]; then
  echo "== bench sim ${SIM_ARGS:-}"
  timeout "${SIM_LIMIT:-280}" $B --mode sim ${SIM_ARGS:-} --csv "$OUT/sim.csv" --plot "$OUT/sim.png" \
    >"$OUT/sim.txt" 2>"$OUT/sim.err"; echo "rc=$?"; cat "$OUT/sim.txt"; tail -5 "$OUT/sim.err"
fi
if [ "${TORCH:-0}" = 1 ] && [ "$gpus" -ge 2 ]; then
  echo "== nccl_symm_bench.py (PyTorch + NCCL anchors)"
  timeout 240 torchrun --nproc-per-node="$gpus" .carry/nccl_symm_bench.py >"$OUT/torch.txt" 2>&1; echo "rc=$?"; tail -14 "$OUT/torch.txt"
fi
