#!/usr/bin/env bash
# One device call on one GPU: Nsight Compute on simulated ranks, each row's whole CUDA graph (20
# all-reduces on N rank streams) as one workload (--graph-profiling graph: the kernels inside run
# concurrently, as unprofiled; the bench's --profiler keeps every other launch out of its way).
# DIR (default .carry-ncu) holds `bench` (edgellm-allreduce-bench, release, stripped). Prints per
# profiled graph its time, DRAM bytes read and written and L2 traffic; workloads 0-2 are the copy
# roofline, the floor and the one-op check, 3 the timed graph, 4 the check after it. CONFIGS
# overrides the rows ("N SIZE STRATEGY;..."). Raw CSVs go to $OUT.
set -uo pipefail
dir=$(realpath "${1:-.carry-ncu}")
OUT=${OUT:-/tmp/o}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda*/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)
echo "ncu: ${ncu:-none}"; [ -n "$ncu" ] || exit 2
"$ncu" --version | tail -1
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
configs=${CONFIGS:-"4 1M oneshot;4 4M oneshot;4 4M twoshot;4 64M oneshot;4 64M twoshot;8 4M twoshot;8 64M twoshot;2 4M oneshot;2 64M oneshot"}
IFS=';' read -ra cfgs <<<"$configs"
for cfg in "${cfgs[@]}"; do
  # shellcheck disable=SC2086
  set -- $cfg
  name="n$1_$2_$3"
  timeout 150 "$ncu" --graph-profiling graph --metrics $metrics --csv --page raw \
    "$dir/bench" --mode sim --profiler --ranks $1 --sizes $2 --strategies $3 --graph-ops 20 \
    --workspace-bytes 64M --replays 1 --batches 1 --warmup 0 --csv "$OUT/$name.bench.csv" --no-plot \
    >"$OUT/$name.ncu.csv" 2>"$OUT/$name.err"
  rc=$?
  echo "== $name rc=$rc"
  if grep -q "ERR_NVGPUCTRPERM\|permission" "$OUT/$name.err" "$OUT/$name.ncu.csv"; then echo "no permission for the counters"; grep -m2 -i "perm" "$OUT/$name.err"; exit 3; fi
  python3 - "$OUT/$name.ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
try:
    h = next(i for i, r in enumerate(rows) if "dram__bytes_read.sum" in r)
except StopIteration:
    print("   no metrics:", " | ".join(" ".join(r) for r in rows[-3:])[:400]); sys.exit()
hdr = rows[h]; units = rows[h + 1]
col = {k: hdr.index(k) for k in hdr}
name_col = next((k for k in ("Kernel Name", "Graph Name", "Name") if k in col), hdr[4])
for r in rows[h + 2:]:
    if len(r) != len(hdr): continue
    g = lambda k: r[col[k]]
    print(f"   {r[col.get('ID', 0)]:>4} {g(name_col)[:38]:<38} t={g('gpu__time_duration.sum')} {units[col['gpu__time_duration.sum']]}"
          f" dram_r={g('dram__bytes_read.sum')} dram_w={g('dram__bytes_write.sum')} {units[col['dram__bytes_read.sum']]}"
          f" l2={g('lts__t_bytes.sum')} {units[col['lts__t_bytes.sum']]}")
PY
done
