#!/usr/bin/env bash
# Runs the gtest suite (TensorRT 10 and 11 builds) on a GPU machine against a built library.
# Usage: tools/gpu/run_gpu_tests.sh DIR   where DIR holds libNvInfer_edgellm_plugin.so.1 and the
# edgellm_plugin_tests_trt* binaries (tools/gpu/stage.sh puts them in .carry/). Logs go to $OUT
# (or DIR). NCCL: $EDGELLM_TEST_NCCL_LIBRARY, else the first libnccl.so.2 found on the machine.
# Exits non-zero when a test fails, or when the GPU tests could not run (no CUDA device).
set -uo pipefail
dir=$(realpath "${1:-.carry}")
out=${OUT:-$dir}
export EDGELLM_PLUGIN_PATH="$dir/libNvInfer_edgellm_plugin.so.1"
if [ -z "${EDGELLM_TEST_NCCL_LIBRARY:-}" ]; then
  EDGELLM_TEST_NCCL_LIBRARY=$( (ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}'; \
    find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null) | head -n1)
  export EDGELLM_TEST_NCCL_LIBRARY
fi
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "NCCL: $EDGELLM_TEST_NCCL_LIBRARY"
status=0
for t in "$dir"/edgellm_plugin_tests_trt*; do
  name=$(basename "$t")
  "$t" --gtest_output="xml:$out/$name.xml" >"$out/$name.log" 2>&1 || status=1
  if grep -q "no CUDA device" "$out/$name.log"; then
    echo "$name: the GPU tests found no CUDA device"; status=1
  fi
  echo "$name: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')"
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\] Gpu' "$out/$name.log"
done
exit $status
