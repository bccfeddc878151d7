#!/usr/bin/env bash
# One device call (one GPU): the link probe (issue 41, item 1) on our one-GPU machine, where the
# link is the GPU's own PCIe link to pinned host memory (GPU-to-host, not GPU-to-GPU). Runs
# `edgellm-allreduce-bench probe --mode host --quick` (its wall time: the ~10 s claim), then the
# full sweep (bounded at 280 s; it takes well under a minute), and prints the checks, the
# summary and the 16 MiB lines against CTAs. Logs and CSVs in $OUT. Expects DIR (default
# .carry-probe, git-ignored: carry it) with edgellm-allreduce-bench, staged with
#   EDGELLM_CUDA_ARCHS=90 cargo build --release -p edgellm-allreduce-bench &&
#   mkdir -p .carry-probe && cp target/release/edgellm-allreduce-bench .carry-probe/ && strip .carry-probe/*
# (else target/release/edgellm-allreduce-bench of this tree).
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.carry-probe}
B="$dir/edgellm-allreduce-bench"
[ -x "$B" ] || B=target/release/edgellm-allreduce-bench
[ -x "$B" ] || { echo "no edgellm-allreduce-bench in $dir or target/release (see the header)"; exit 2; }
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,pci.bus_id,pcie.link.gen.max,pcie.link.width.max \
  --format=csv,noheader

timed() { # name limit args...: runs the probe, says its status and wall time
  local name=$1 limit=$2 start rc; shift 2
  start=$(date +%s%N)
  timeout "$limit" "$B" probe --mode host --csv "$OUT/$name.csv" "$@" >"$OUT/$name.txt" 2>&1; rc=$?
  echo "$name: rc=$rc in $(( ($(date +%s%N) - start) / 1000000 )) ms ($(grep -c . "$OUT/$name.csv" 2>/dev/null) CSV lines)"
}
timed probe-quick 60 --quick
timed probe 280
grep -E "^(edgellm|GPU|note|error)|check:" "$OUT/probe.txt"
sed -n '/^summary/,$p' "$OUT/probe.txt"
echo "16 MiB, GB/s against CTAs:"
printf "  %5s %9s %9s %9s\n" CTAs sm_write sm_read sm_both
awk -F, 'NR > 1 && $5 == 16777216 && $4 ~ /^sm_/ { v[$6 "," $4] = $7; c[$6] = 1 }
  END { for (k in c) printf "  %5d %9s %9s %9s\n", k, v[k ",sm_write"], v[k ",sm_read"], v[k ",sm_both"] }' \
  "$OUT/probe.csv" | sort -n
