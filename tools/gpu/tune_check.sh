#!/usr/bin/env bash
# One device call (one GPU): AUTO tuned on this machine (issue 29). `edgellm-allreduce-bench tune
# --mode sim` writes a tuning file for simulated ranks (2, 4, 8; bf16; plain and fused); then
# the benchmark runs the same sweeps with the library reading that file
# (EDGELLM_ALLREDUCE_TUNING) and prints AUTO's time over the best way's at every size: the
# `auto` / `fused_auto` cells show the path the loaded file chose. Expects DIR (default
# .carry-tune) with edgellm-allreduce-bench (tools/gpu/stage_contract.sh). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath "${1:-.carry-tune}")
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_NVLS_ENABLE=0
B="$dir/edgellm-allreduce-bench"
args=(--mode sim --ranks 2,4,8 --dtype bf16 --graph-ops 20 --workspace-bytes 64M)
timeout 420 "$B" tune "${args[@]}" --out "$OUT/tuning.txt" --csv "$OUT/tune.csv" >"$OUT/tune.log" 2>&1
echo "tune rc=$? ($(grep -c . "$OUT/tuning.txt" 2>/dev/null) lines)"; tail -n 3 "$OUT/tune.log"
EDGELLM_ALLREDUCE_TUNING="$OUT/tuning.txt" EDGELLM_ALLREDUCE_LOG_LEVEL=info timeout 300 "$B" "${args[@]}" \
  --suite all --csv "$OUT/tuned.csv" >"$OUT/tuned.txt" 2>&1
echo "tuned sweep rc=$?"; grep -iE "tuning|auto/best|warning" "$OUT/tuned.txt" | head -n 8
grep -E "^ *[0-9]" "$OUT/tuned.txt" | tail -n 4
