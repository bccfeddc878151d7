#!/usr/bin/env bash
# AUTO tuned on this machine (issues 29, 41), on one GPU. Steps (STEPS, default all three; on a
# device whose commands stop at 10 minutes, run `quick,tune` in one call and `sweep` in the next,
# with TUNING naming the tuning file the first wrote, carried back):
#   quick  `tune --mode sim --quick`, timed: it must end in about a minute (issue 41 item 5); its
#          report (tune-report.txt) is printed;
#   tune   `tune --mode sim` for simulated ranks (2, 4, 8; bf16; plain and fused): the grid sweep
#          (tune-grid.csv), then the tables at the chosen caps, the tuning file with its grid
#          lines and the report;
#   sweep  the benchmark's sweeps with the library reading that file (EDGELLM_ALLREDUCE_TUNING):
#          AUTO's time over the best way's at every size; the `auto` / `fused_auto` cells show the
#          path the loaded file chose, and the family rows run at the file's grid caps.
# Expects DIR (default .carry-tune) with edgellm-allreduce-bench (tools/gpu/stage_contract.sh).
# Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath "${1:-.carry-tune}")
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
steps=",${STEPS:-quick,tune,sweep},"
export CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_NVLS_ENABLE=0
B="$dir/edgellm-allreduce-bench"
args=(--mode sim --ranks 2,4,8 --dtype bf16 --graph-ops 20 --workspace-bytes 64M)
tuning=${TUNING:-$OUT/tuning.txt}
if [[ $steps == *,quick,* ]]; then
  start=$SECONDS
  timeout 300 "$B" tune --mode sim --quick --out "$OUT/quick-tuning.txt" --csv "$OUT/quick.csv" \
    --report "$OUT/quick-report.txt" >"$OUT/quick.log" 2>&1
  echo "tune --quick rc=$? in $((SECONDS - start)) s ($(grep -m1 '^tune:' "$OUT/quick.log"))"
  cat "$OUT/quick-report.txt" 2>/dev/null || tail -n 5 "$OUT/quick.log"
fi
if [[ $steps == *,tune,* ]]; then
  start=$SECONDS
  timeout 540 "$B" tune "${args[@]}" --out "$tuning" --csv "$OUT/tune.csv" --report "$OUT/tune-report.txt" \
    >"$OUT/tune.log" 2>&1
  echo "tune rc=$? in $((SECONDS - start)) s ($(grep -c . "$tuning" 2>/dev/null) lines)"; tail -n 3 "$OUT/tune.log"
  grep -A20 '^grid caps' "$OUT/tune.log" | head -n 14
  grep '^grid ' "$tuning" 2>/dev/null
fi
if [[ $steps == *,sweep,* ]]; then
  EDGELLM_ALLREDUCE_TUNING="$tuning" EDGELLM_ALLREDUCE_LOG_LEVEL=info timeout 300 "$B" "${args[@]}" \
    --suite all --csv "$OUT/tuned.csv" >"$OUT/tuned.txt" 2>&1
  echo "tuned sweep rc=$?"; grep -iE "tuning|auto/best|warning" "$OUT/tuned.txt" | head -n 8
  grep -E "^ *[0-9]" "$OUT/tuned.txt" | tail -n 4
fi
