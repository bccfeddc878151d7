#!/usr/bin/env bash
# compute-sanitizer on the quick kernel simulations (plain and fused, one launch for all ranks: the
# sanitizer serializes kernels, which would deadlock ranks on separate streams), and on the peer
# self-test's Rust test when .carry/rust_gpu_selftest is there (tools/gpu/stage.sh; its ranks
# end at their bound, so serialized kernels only time out). Exits non-zero when any run fails or
# reports an error.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
[ -n "$san" ] || { echo "no compute-sanitizer on this machine"; exit 2; }
status=0
for sim in ${SIMS:-sim_ranks sim_fused}; do
  for tool in ${SAN_TOOLS:-memcheck}; do
    echo "== compute-sanitizer --tool $tool $sim --quick --one-launch"
    timeout "${SAN_LIMIT:-170}" "$san" --tool "$tool" --error-exitcode 9 ".carry/$sim" --quick --one-launch --no-timing --timeout 150 \
      >"$OUT/san_${sim}_$tool.log" 2>&1
    rc=$?; echo "rc=$rc"; [ "$rc" -eq 0 ] || status=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" "$OUT/san_${sim}_$tool.log" | tail -3
  done
done
if [ -x .carry/rust_gpu_selftest ]; then
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    echo "== compute-sanitizer --tool $tool rust_gpu_selftest (the peer self-test)"
    timeout "${SAN_LIMIT:-170}" "$san" --tool "$tool" --error-exitcode 9 .carry/rust_gpu_selftest --ignored \
      --exact under_a_sanitizer_the_self_test_touches_only_its_memory --nocapture >"$OUT/san_selftest_$tool.log" 2>&1
    rc=$?; echo "rc=$rc"; [ "$rc" -eq 0 ] || status=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$OUT/san_selftest_$tool.log" | tail -3
  done
fi
exit $status
