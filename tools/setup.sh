#!/usr/bin/env bash
# Installs what the build needs on a machine with no CUDA and no TensorRT, and prints the
# environment to use (eval "$(tools/setup.sh)").
#   - cmake, g++ and GoogleTest from apt (when missing and we are root);
#   - the CUDA 13.0 compiler and headers from PyPI (pinned set), unless CUDA_HOME is set;
#   - TensorRT 10.16 and 11.4 headers from the sources of the trtx-sys crate (0.5.0 and
#     0.9.1), fetched by cargo and never built, unless TRT_ROOT is set.
# Everything goes to one cache folder shared by clones ($EDGELLM_TOOLCHAIN_DIR).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${EDGELLM_TOOLCHAIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgellm-allreduce}
mkdir -p "$cache"
say() { echo "setup: $*" >&2; }

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/src/googletest/CMakeLists.txt ] || [ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    say "apt-get install ${need_apt[*]}"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
  else
    say "missing ${need_apt[*]}: install them (apt-get install ${need_apt[*]})"; exit 1
  fi
fi

if [ -z "${CUDA_HOME:-}" ]; then
  cuda_prefix="$cache/cuda-13.0.88"
  if [ ! -x "$cuda_prefix/nvidia/cu13/bin/nvcc" ]; then
    say "installing the CUDA 13.0 compiler from PyPI into $cuda_prefix"
    rm -rf "$cuda_prefix.tmp"
    python3 -m pip install -q --disable-pip-version-check --no-warn-script-location \
      --target "$cuda_prefix.tmp" -c "$here/cuda-constraints.txt" \
      nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt nvidia-cuda-runtime nvidia-cuda-cccl >&2
    mv "$cuda_prefix.tmp" "$cuda_prefix"
  fi
  CUDA_HOME="$cuda_prefix/nvidia/cu13"
fi
[ -x "$CUDA_HOME/bin/nvcc" ] || { say "no nvcc under CUDA_HOME=$CUDA_HOME"; exit 1; }

# TensorRT headers: one folder per major version, each holding NvInfer*.h.
trt_headers() { # $1 = crate version, $2 = header folder in the crate, $3 = destination
  local dest="$cache/$3"
  [ -f "$dest/NvInferRuntime.h" ] && { echo "$dest"; return; }
  say "fetching TensorRT headers from trtx-sys $1"
  (cd "$cache" && cargo info "trtx-sys@$1" >/dev/null 2>&1) || true
  local crate
  crate=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"trtx-sys-$1.crate" 2>/dev/null | head -n1)
  [ -n "$crate" ] || { say "could not fetch trtx-sys $1 with cargo"; exit 1; }
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  tar xzf "$crate" -C "$dest.tmp" --strip-components=3 "trtx-sys-$1/TensorRT-Headers/$2"
  mv "$dest.tmp" "$dest"
  echo "$dest"
}
if [ -n "${TRT_ROOT:-}" ]; then
  trt10="$TRT_ROOT/include"; trt11="${TRT11_INCLUDE:-}"
else
  trt10=$(trt_headers 0.5.0 TRT-Enterprise-10.16 trt-10.16)
  trt11=$(trt_headers 0.9.1+rtx1.7 TRT-Enterprise-11.4 trt-11.4)
fi

echo "export CUDA_HOME='$CUDA_HOME'"
echo "export EDGELLM_TRT_INCLUDE='$trt10'"
echo "export EDGELLM_TRT11_INCLUDE='$trt11'"
