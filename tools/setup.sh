#!/usr/bin/env bash
# Installs what the build needs on a machine with no CUDA and no TensorRT, and prints the
# environment to use (eval "$(tools/setup.sh)").
#   - cmake, g++ and GoogleTest from apt (when missing and we are root);
#   - the CUDA 13.0 compiler and headers from PyPI (pinned set), unless CUDA_HOME is set;
#   - TensorRT 10.16 and 11.4 headers from the sources of the trtx-sys crate (0.5.0 and
#     0.9.1), fetched by cargo and never built, unless TRT_ROOT is set.
#   - cuobjdump (a pinned PyPI wheel) for the test that lists the library's kernel images;
#   - with EDGELLM_TARGET=aarch64-unknown-linux-gnu on another host, the cross build's extras:
#     g++-aarch64-linux-gnu and qemu-user-static from apt, the Rust target through rustup, the
#     aarch64 CUDA runtime (PyPI) and GoogleTest built for aarch64 (for the tests).
# Everything goes to one cache folder shared by clones ($EDGELLM_TOOLCHAIN_DIR).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${EDGELLM_TOOLCHAIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgellm-allreduce}
mkdir -p "$cache"
say() { echo "setup: $*" >&2; }

target=${EDGELLM_TARGET:-}
host=$(uname -m)-unknown-linux-gnu
[ "$target" = "$host" ] && target=
case "$target" in
  "" | aarch64-unknown-linux-gnu) ;;
  *) say "EDGELLM_TARGET=$target is not supported (aarch64-unknown-linux-gnu, or unset for the host)"; exit 1 ;;
esac

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/src/googletest/CMakeLists.txt ] || [ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ -n "$target" ]; then
  command -v aarch64-linux-gnu-g++ >/dev/null || need_apt+=(g++-aarch64-linux-gnu)
  command -v qemu-aarch64-static >/dev/null || command -v qemu-aarch64 >/dev/null || need_apt+=(qemu-user-static)
  [ -f /usr/src/googletest/CMakeLists.txt ] || need_apt+=(googletest)
fi
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

# cuobjdump: not in the 13.0 set (its wheels start at 13.2); it only lists images.
cuobjdump_prefix="$cache/cuobjdump-13.2.51"
if [ ! -x "$cuobjdump_prefix/nvidia/cu13/bin/cuobjdump" ]; then
  say "installing cuobjdump from PyPI into $cuobjdump_prefix"
  rm -rf "$cuobjdump_prefix.tmp"
  python3 -m pip install -q --disable-pip-version-check --no-deps --target "$cuobjdump_prefix.tmp" \
    nvidia-cuda-cuobjdump==13.2.51 >&2
  mv "$cuobjdump_prefix.tmp" "$cuobjdump_prefix"
fi

if [ -n "$target" ]; then
  # The Rust standard library for the target.
  if ! rustc --print sysroot >/dev/null 2>&1 || [ ! -d "$(rustc --print sysroot)/lib/rustlib/$target" ]; then
    command -v rustup >/dev/null || { say "no Rust standard library for $target and no rustup to add it"; exit 1; }
    say "rustup target add $target"
    rustup target add "$target" >&2
  fi
  # The aarch64 CUDA runtime (the GPU tests link it statically; headers are the host's).
  runtime_prefix="$cache/cuda-runtime-13.0.96-aarch64"
  if [ ! -f "$runtime_prefix/nvidia/cu13/lib/libcudart_static.a" ]; then
    say "fetching the aarch64 CUDA runtime from PyPI into $runtime_prefix"
    rm -rf "$runtime_prefix.tmp" && mkdir -p "$runtime_prefix.tmp"
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --platform manylinux2014_aarch64 -d "$runtime_prefix.tmp" nvidia-cuda-runtime==13.0.96 >&2
    python3 -m zipfile -e "$runtime_prefix.tmp"/nvidia_cuda_runtime-*.whl "$runtime_prefix.tmp" >&2
    mv "$runtime_prefix.tmp" "$runtime_prefix"
  fi
  # GoogleTest for aarch64, from Debian's sources, with the cross compiler.
  gtest_prefix="$cache/googletest-aarch64"
  if [ ! -f "$gtest_prefix/lib/cmake/GTest/GTestConfig.cmake" ]; then
    say "building GoogleTest for aarch64 into $gtest_prefix"
    rm -rf "$gtest_prefix.build" "$gtest_prefix.tmp"
    cmake -S /usr/src/googletest -B "$gtest_prefix.build" -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
      "-DCMAKE_TOOLCHAIN_FILE=$here/../cmake/toolchains/aarch64-linux-gnu.cmake" \
      "-DCMAKE_INSTALL_PREFIX=$gtest_prefix.tmp" >/dev/null
    cmake --build "$gtest_prefix.build" -j"$(nproc)" >/dev/null
    cmake --install "$gtest_prefix.build" >/dev/null
    rm -rf "$gtest_prefix.build"
    mv "$gtest_prefix.tmp" "$gtest_prefix"
  fi
fi

echo "export CUDA_HOME='$CUDA_HOME'"
echo "export EDGELLM_TRT_INCLUDE='$trt10'"
echo "export EDGELLM_TRT11_INCLUDE='$trt11'"
echo "export EDGELLM_CUOBJDUMP='$cuobjdump_prefix/nvidia/cu13/bin/cuobjdump'"
if [ -n "$target" ]; then
  echo "export EDGELLM_TARGET_CUDART_STATIC='$runtime_prefix/nvidia/cu13/lib/libcudart_static.a'"
  echo "export EDGELLM_TARGET_GTEST_DIR='$gtest_prefix/lib/cmake/GTest'"
fi
