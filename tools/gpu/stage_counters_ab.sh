#!/usr/bin/env bash
# Branch issue42-late-counters: stages the one device call that decides it (tools/gpu/counters_ab.sh)
# into .carry-x/ and packs it with the contract check's .carry-contract/ into .carry-gpu/x.tar.xz
# (xz -9: the binaries share most bytes; about 40 MB). Benches: O0 = main's kernels (BASE, default
# main), SL = this branch with EAR_EXP_STRIDED (main's copy assignment, the Lamport kernels writing
# the copies after push and clear), AL = this branch. Device: `tar -xJf .carry-gpu/x.tar.xz &&
# OUT=$OUT bash .carry-x/counters_ab.sh`, carry [".carry-gpu"].
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
eval "$(tools/setup.sh)"
export EDGELLM_CUDA_ARCHS=${EDGELLM_CUDA_ARCHS:-90}
base=${BASE:-main}
x=.carry-x
rm -rf "$x"
mkdir -p "$x/peers" .carry-gpu
build_bench() {
  cargo build --release -q -p edgellm-allreduce-bench
  strip -o "$x/bench-$1" target/release/edgellm-allreduce-bench
}
tmp=$(mktemp -d)
git archive "$base" kernels | tar -x -C "$tmp"
cp -r kernels "$tmp/branch-kernels"
# Every step on a line of its own: `set -e` does not stop at a failure before `&&`.
cp "$tmp"/kernels/* kernels/
build_bench O0
cp "$tmp"/branch-kernels/* kernels/
sed -i 's|^#pragma once$|#pragma once\n#define EAR_EXP_STRIDED|' kernels/sync.cuh
build_bench SL
cp "$tmp"/branch-kernels/sync.cuh kernels/sync.cuh
build_bench AL
git diff --quiet -- kernels || { echo "kernels/ differ from the branch after staging"; exit 1; }
rm -rf "$tmp"
"$CUDA_HOME/bin/nvcc" -O3 -std=c++17 -arch=sm_90 -L"$CUDA_HOME/lib" -Werror all-warnings \
  tools/gpu/lamport_stages.cu -o "$x/lamport_stages"
strip "$x/lamport_stages"
bash ../shared/peers/build.sh "$root/target/peers" "$root"
cp target/peers/peerbench "$x/peers/"
cp tools/gpu/counters_ab.sh "$x/"
cmake --build build -j2
bash tools/gpu/stage_contract.sh
tar -cf - "$x" .carry-contract | xz -T2 -9 > .carry-gpu/x.tar.xz
ls -la .carry-gpu
