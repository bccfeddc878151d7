#!/usr/bin/env bash
# Issue 42, branch issue42-late-counters (staged by tools/gpu/stage_counters_ab.sh): one call on
# one GPU. edgellm-allreduce-bench --mode sim of O0 (main's kernels), SL (main's copy assignment,
# the Lamport kernels writing the copies after push and clear) and AL (this branch), two rounds
# interleaved, beside peerbench's vLLM one-stage and FlashInfer Lamport rows: a compact table. Then
# the contract check of AL and lamport_stages (its begin rows split read_call and write_next_counters).
set -u
X=$(dirname "$0")
export CUDA_DEVICE_MAX_CONNECTIONS=32
L=$OUT/logs; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
B="--mode sim --ranks 2,4,8 --dtype bf16 --workspace-bytes 64M --replays 10 --batches 20 --warmup 3 --graph-ops 20 --timeout 60 --no-eager --no-plot"
runs=()
for round in 1 2; do
  order="O0 SL AL"; [ $round = 2 ] && order="AL SL O0"
  for v in $order; do
    n=${v}_r$round
    timeout 120 $X/bench-$v $B --sizes 16,8K,64K,256K,1M --strategies oneshot,lamport,twoshot --csv $L/p-$n.csv >$L/p-$n.txt 2>&1 || echo "plain $n rc=$?"
    timeout 120 $X/bench-$v $B --suite fused --strategies fused_lamport --shapes 1x4096,8x4096,32x8192 --bias off --csv $L/f-$n.csv >$L/f-$n.txt 2>&1 || echo "fused $n rc=$?"
    runs+=($n)
  done
done
timeout 120 $X/peers/peerbench --suite plain --ranks 2,4,8 --sizes 8K,64K,256K,1M --rows vllm_1stage,fi_oneshot --replays 10 --batches 20 --warmup 3 --graph-ops 20 --timeout 60 --csv $L/peers.csv >$L/peers.txt 2>&1 || echo "peers rc=$?"
python3 - "$L" "${runs[@]}" <<'PY'
import csv, sys
L, runs = sys.argv[1], sys.argv[2:]
t = {}
for run in runs:
    for kind in "pf":
        try: rows = list(csv.DictReader(open(f"{L}/{kind}-{run}.csv")))
        except OSError: continue
        for r in rows:
            if r["status"] != "ok" or r["strategy"] in ("copy","floor"): continue
            key = (int(r["ranks"]), r.get("shape") or r["bytes"], r["strategy"].replace("fused_", "f_")[:7])
            t.setdefault(key, {})[run] = float(r["median_us"])
try:
    for r in csv.DictReader(open(f"{L}/peers.csv")):
        if r["status"] != "ok" or r["strategy"] in ("copy","floor"): continue
        t.setdefault((int(r["ranks"]), r["bytes"], r["strategy"][:7]), {})["peer"] = float(r["median_us"])
except Exception as e: print("peers csv:", e)
vs = ["O0", "SL", "AL"]
print(f"{'N':>1} {'size':>7} {'row':>7} " + " ".join(f"{v+'_r'+str(i):>5}" for v in vs for i in (1,2)) + "  peer")
for (n, b, s), v in sorted(t.items(), key=lambda k: (k[0][0], len(k[0][1]), k[0][1], k[0][2])):
    print(f"{n:>1} {b:>7} {s:>7} " + " ".join(f"{v[c]:5.2f}" if c in v else f"{'-':>5}" for c in [x+'_r'+str(i) for x in vs for i in (1,2)] + ["peer"]))
PY
OUT=$OUT/cc TUNE_BENCH=$X/bench-AL timeout 200 bash tools/gpu/contract_check.sh .carry-contract > $OUT/contract.txt 2>&1; echo "contract rc=$?"
grep -a "^PASS\|^FAIL\|^SKIP\|contract_check:" $OUT/contract.txt | cut -c1-90
tar -czf $OUT/cc.tgz -C $OUT cc && rm -rf $OUT/cc
timeout 100 $X/lamport_stages --timeout 20 > $L/stages.txt 2>&1 || echo "stages rc=$?"
grep -v "^PASS\|^$\|grid <=" $L/stages.txt | sed 's/  */ /g'
grep -h "FAIL\|mismatch\|gave up" $L/stages.txt | head -5
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
