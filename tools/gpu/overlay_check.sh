#!/usr/bin/env bash
# The overlay on a GPU machine with Edge-LLM 0.11's own library as the base, for TensorRT 10 and,
# where the machine's glibc allows (2.39+), TensorRT 11: every creator findable, ours serving
# AllReducePlugin (a tp_size 1 enqueue on the GPU), a plugin of the base created and destroyed,
# the C ABI forwarded. The base loads against the machine's CUDA (driver, libcudart.so.13,
# libnvrtc.so.13) and the stand-in libnvinfer. Usage: tools/gpu/overlay_check.sh DIR (.carry-overlay
# of tools/gpu/stage.sh). Exits non-zero when any run fails.
set -uo pipefail
dir=$(realpath "${1:-.carry-overlay}")
out=${OUT:-$dir}
# The CUDA 13 runtime and NVRTC the base needs: the system's, else those of the Python wheels.
for lib in libcudart.so.13 libnvrtc.so.13; do
  found=$( (ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}'; \
    find / -name "$lib" -not -path '/proc/*' 2>/dev/null) | head -n1)
  [ -n "$found" ] && export LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "$lib: ${found:-not found}"
done
echo "glibc: $(getconf GNU_LIBC_VERSION)"
status=0
for major in 10 11; do
  base="$dir/edgellm-trt$major/libNvInfer_edgellm_plugin_base.so"
  name="overlay_trt$major"
  EDGELLM_PLUGIN_PATH="$dir/libNvInfer_edgellm_plugin.so.1" EDGELLM_OVERLAY_TEST_BASE="$base" \
    EDGELLM_ALLREDUCE_BASE_LIBRARY="$base" EDGELLM_ALLREDUCE_LOG_LEVEL=info \
    "$dir/edgellm_overlay_tests_trt$major" --gtest_filter='OverlayRuntime.*:OverlayGpu.*:OverlayLoadLibrary.*' \
    >"$out/$name.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ "$major" = 11 ] && grep -q "GLIBC_2.3[89]' not found" "$out/$name.log"; then
    echo "$name: not run: the TensorRT 11 payload needs glibc 2.39 ($(getconf GNU_LIBC_VERSION) here)"
    continue
  fi
  [ $rc -eq 0 ] || status=1
  echo "$name: rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')"
  grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|serves every plugin|could not be loaded' "$out/$name.log"
done
exit $status
