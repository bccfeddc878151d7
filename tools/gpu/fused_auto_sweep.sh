#!/usr/bin/env bash
# One device call on one GPU: the fused sweep that AUTO's fused tables are chosen from
# (issue 30): edgellm-allreduce-bench --mode sim --fused at 2, 4 and 8 simulated ranks, every
# fused family, AUTO's choice, and the plain all-reduce then the norm kernel (ar_then_norm). Prints
# one table per rank count: µs per shape and row, the best of all, and fused_auto / best.
# Usage: fused_auto_sweep.sh BENCH; CSVs and logs go to $OUT.
set -uo pipefail
bench=$(realpath "${1:?the bench binary}")
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
export CUDA_DEVICE_MAX_CONNECTIONS=32
args=${ARGS:---ranks 2,4,8 --strategies fused_oneshot,fused_twoshot,fused_lamport,fused_auto,ar_then_norm --graph-ops 20 --replays 10 --batches 20}
# ROUNDS runs of the sweep (default 2); EXTRA_SHAPES adds one run of those shapes (bench --shapes).
csvs=()
for round in $(seq 1 "${ROUNDS:-2}"); do
  # shellcheck disable=SC2086
  timeout 200 "$bench" --mode sim --fused $args --csv "$OUT/fused_r$round.csv" --no-plot >"$OUT/fused_r$round.txt" 2>&1 ||
    echo "bench rc=$?"
  csvs+=("$OUT/fused_r$round.csv")
done
if [ -n "${EXTRA_SHAPES:-}" ]; then
  # shellcheck disable=SC2086
  timeout 200 "$bench" --mode sim --fused $args --shapes "$EXTRA_SHAPES" --csv "$OUT/fused_extra.csv" --no-plot \
    >"$OUT/fused_extra.txt" 2>&1 || echo "bench rc=$?"
  csvs+=("$OUT/fused_extra.csv")
fi
# Each row: the median over the runs that measured it.
python3 - "${csvs[@]}" <<'PY'
import csv, statistics, sys
rows = [r for f in sys.argv[1:] for r in csv.DictReader(open(f)) if r["status"] == "ok" and r.get("shape")]
samples = {}
for r in rows:
    samples.setdefault((int(r["ranks"]), r["dtype"], r["shape"], r["strategy"]), []).append(float(r["median_us"]))
table = {}
for (n, d, s, k), v in samples.items():
    table.setdefault((n, d, s), {})[k] = statistics.median(v)
for r in rows:
    if r["strategy"] in ("fused_auto", "ar_then_norm"):
        table[(int(r["ranks"]), r["dtype"], r["shape"])][r["strategy"] + " path"] = r["path"]
names = ["fused_oneshot", "fused_twoshot", "fused_lamport", "ar_then_norm", "fused_auto"]
print(f"{'ranks':>5} {'dtype':>5} {'shape':>14} " + " ".join(f"{n:>13}" for n in names) + f" {'auto/best':>9}  paths (auto, ar_then_norm)")
def order(item):
    (n, d, s), _ = item
    tokens, hidden = s.split("+")[0].split("x")
    return n, d, int(tokens) * int(hidden), s
for (n, d, s), v in sorted(table.items(), key=order):
    best = min(x for k, x in v.items() if k in names[:4])
    cells = " ".join(f"{v[k]:>13.2f}" if k in v else f"{'-':>13}" for k in names)
    ratio = v.get("fused_auto", float("nan")) / best
    print(f"{n:>5} {d:>5} {s:>14} {cells} {ratio:>9.3f}  {v.get('fused_auto path', '')}, {v.get('ar_then_norm path', '')}")
PY
