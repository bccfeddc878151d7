#!/usr/bin/env bash
# compute-sanitizer memcheck on the quick kernel simulations (plain and fused, one launch for all
# ranks: the sanitizer serializes kernels, which would deadlock ranks on separate streams).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/edgellm-out}; mkdir -p "$OUT"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
for sim in ${SIMS:-sim_ranks sim_fused}; do
  for tool in ${SAN_TOOLS:-memcheck}; do
    echo "== compute-sanitizer --tool $tool $sim --quick --one-launch"
    timeout "${SAN_LIMIT:-170}" "$san" --tool "$tool" --error-exitcode 9 ".carry/$sim" --quick --one-launch --no-timing --timeout 150 \
      >"$OUT/san_${sim}_$tool.log" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" "$OUT/san_${sim}_$tool.log" | tail -3
  done
done
