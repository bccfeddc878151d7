#!/usr/bin/env bash
# Stand-ins for the CUDA libraries Edge-LLM's plugin library needs to load on a machine without
# a GPU (CI): libcuda.so.1 and libnvrtc.so.13 exporting every symbol the library imports from
# them, each returning an error code (CUDA_ERROR_STUB_LIBRARY; NVRTC_ERROR_INTERNAL_ERROR). Never
# on a GPU machine: there the real driver and NVRTC are used.
# Usage: stub_cuda_libraries.sh EDGELLM_LIBRARY OUT_DIR [CC]
set -euo pipefail
base=$1 out=$2 cc=${3:-cc}
mkdir -p "$out"
imports=$(nm -D --undefined-only "$base" | awk '{print $2}')
# The driver API is unversioned; cuInit and cuDriverGetVersion are what a driver loader asks
# first (this library's cudarc too, when it finds this stand-in already loaded).
{ grep -E '^cu[A-Z]' <<<"$imports" || true; echo cuInit; echo cuDriverGetVersion; } | sort -u |
  awk '{print "int " $1 "(void) { return 34; }"}' >"$out/cuda_stub.c"
# NVRTC's symbols carry the version node libnvrtc.so.13.
grep -oP '^nvrtc\w+(?=@libnvrtc\.so\.13)' <<<"$imports" | sort -u |
  awk '{print "int " $1 "(void) { return 11; }"}' >"$out/nvrtc_stub.c"
echo 'libnvrtc.so.13 { global: *; };' >"$out/nvrtc_stub.map"
"$cc" -x c -shared -fPIC -o "$out/libcuda.so.1" -Wl,-soname,libcuda.so.1 "$out/cuda_stub.c"
"$cc" -x c -shared -fPIC -o "$out/libnvrtc.so.13" -Wl,-soname,libnvrtc.so.13 \
  -Wl,--version-script="$out/nvrtc_stub.map" "$out/nvrtc_stub.c"
