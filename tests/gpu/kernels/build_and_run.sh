#!/usr/bin/env bash
# Builds a one-GPU N-rank simulation of the kernels and runs it: sim_ranks (the all-reduce
# kernels), or with SIM_NAME=sim_fused (build_and_run_fused.sh) the fused all-reduce +
# residual + RMSNorm kernels.
#   tests/gpu/kernels/build_and_run.sh [options]    e.g. --quick, --one-launch, --no-timing
#   tests/gpu/kernels/build_and_run.sh sanitize     memcheck, synccheck, racecheck on --quick --one-launch
# nvcc comes from $CUDA_HOME/bin, else PATH. SIM_ARCH overrides the target (default sm_90),
# SIM_OUT the output folder; SIM_BUILD_ONLY=1 builds without running.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${SIM_NAME:-sim_ranks}
if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  nvcc="$CUDA_HOME/bin/nvcc"
else
  nvcc=$(command -v nvcc) || { echo "no nvcc: set CUDA_HOME or PATH" >&2; exit 2; }
fi
out=${SIM_OUT:-$here/build}
mkdir -p "$out"
cuda_root=$(cd "$(dirname "$nvcc")/.." && pwd)
libs=()
for d in "$cuda_root/lib64" "$cuda_root/lib"; do [ -d "$d" ] && libs+=("-L$d"); done
"$nvcc" -O3 -std=c++17 -arch="${SIM_ARCH:-sm_90}" -lineinfo -Werror all-warnings -Xcompiler -Werror=switch "${libs[@]}" \
  "$here/$name.cu" -o "$out/$name"
[ "${SIM_BUILD_ONLY:-0}" = 1 ] && exit 0

if [ "${1:-}" = sanitize ]; then
  san=$(dirname "$nvcc")/compute-sanitizer
  [ -x "$san" ] || san=$(command -v compute-sanitizer) || { echo "no compute-sanitizer" >&2; exit 2; }
  shift
  rc=0
  # One launch for all ranks: the sanitizer may serialize concurrent kernels, which would
  # deadlock ranks that spin on each other from separate streams.
  for tool in memcheck synccheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    "$san" --tool "$tool" --error-exitcode 9 "$out/$name" --quick --one-launch --timeout 300 "$@" || rc=$?
  done
  exit $rc
fi
exec "$out/$name" "$@"
