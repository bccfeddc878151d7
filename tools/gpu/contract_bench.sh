#!/usr/bin/env bash
# One device call on one GPU: the fast paths before and after the bounded waits of issue 19, in
# one process each, interleaved (base, new, base, new): edgellm-allreduce-bench --mode sim of the
# two builds that tools/gpu/stage_contract.sh put in DIR (BENCH=1; default
# .carry-contract-bench), with ARGS (default below). Prints one table, µs per all-reduce (graph replay median) per ranks, bytes and
# strategy, one column per run; CSVs and logs go to $OUT.
set -uo pipefail
dir=$(realpath "${1:-.carry-contract-bench}")
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32
args=${ARGS:---ranks 2,4,8 --sizes 8K,1M,64M --strategies oneshot,twoshot,lamport,auto --graph-ops 20 --workspace-bytes 64M --replays 10 --batches 20}
mapfile -t benches < <(ls "$dir"/bench-* 2>/dev/null)
[ ${#benches[@]} = 2 ] || { echo "expected two benches in $dir (BENCH=1 tools/gpu/stage_contract.sh)"; exit 2; }
# The base first: the build that is not HEAD's (its name is the BASE given to the stage script).
base=${BASE:-aa6094a}
order=("$dir/bench-$base" "$(printf '%s\n' "${benches[@]}" | grep -v "bench-$base")")
status=0
runs=()
for round in 1 2; do
  for b in "${order[@]}"; do
    name="$(basename "$b" | sed 's/^bench-//')_r$round"  # no '#': the device tool returns no such name
    echo "== $name: --mode sim $args"
    # shellcheck disable=SC2086
    timeout 280 "$b" --mode sim $args --csv "$OUT/$name.csv" --no-plot >"$OUT/$name.txt" 2>"$OUT/$name.err" || { echo "rc=$?"; status=1; }
    runs+=("$name")
  done
done
python3 - "$OUT" "${runs[@]}" <<'EOF'
import csv, sys
out, runs = sys.argv[1], sys.argv[2:]
table = {}
for run in runs:
    try:
        rows = list(csv.DictReader(open(f"{out}/{run}.csv")))
    except OSError:
        continue
    for r in rows:
        if r["strategy"] in ("floor", "copy") or r["status"] != "ok":
            continue
        table.setdefault((int(r["ranks"]), int(r["bytes"]), r["strategy"]), {})[run] = float(r["median_us"])
print(f"{'ranks':>5} {'bytes':>9} {'strategy':>9} " + " ".join(f"{r:>14}" for r in runs))
for (n, b, s), v in sorted(table.items()):
    print(f"{n:>5} {b:>9} {s:>9} " + " ".join(f"{v[r]:>14.2f}" if r in v else f"{'nan':>14}" for r in runs))
EOF
exit $status
