#!/usr/bin/env bash
# Builds libNvInfer_edgellm_plugin.so and installs the package (lib/, include/, lib/cmake/) with
# Edge-LLM's own plugin library beside it as the overlay's base (docs/OVERLAY.md).
# Usage: tools/install.sh [--target aarch64-unknown-linux-gnu] [--base pypi|none|PATH] [--base-version X.Y.Z] [PREFIX]
#   (default PREFIX: <repo>/dist; for a cross build <repo>/dist-aarch64, built in build-aarch64)
#   --base pypi   (default) Edge-LLM 0.11.0's library from the tensorrt-edgellm wheel of the target
#                 CPU on PyPI (tools/edgellm_base.sh), or EDGELLM_BASE_VARIANT (a payload of it).
#                 x86-64: the payload for the TensorRT major of EDGELLM_TRT_MAJOR (10 or 11,
#                 default 10). aarch64: the payload of this machine's platform (tools/edgellm_variant.py:
#                 the GPU's SM, the L4T / DRIVE OS release, the device model), in a cross build the
#                 default, dgx-spark-cu13-sm121; the payload is printed. Where none fits (a GH200,
#                 Orin on JetPack 6) the default installs no base, with a warning; --base pypi fails.
#   --base PATH   an Edge-LLM libNvInfer_edgellm_plugin.so* of your own (say which version it is
#                 with --base-version; the package reports it as EdgeLLM_VERSION)
#   --base none   ours alone: only AllReducePlugin is served
# EDGELLM_BASE holds the same choice. Installs what it needs first (tools/setup.sh): cmake and
# GoogleTest from apt, the CUDA 13.0 compiler from PyPI, TensorRT headers from the trtx-sys
# crate; CUDA_HOME / TRT_ROOT are honoured. EDGELLM_TARGET=aarch64-unknown-linux-gnu is the same
# as --target: a cross build from x86-64 with Debian's g++-aarch64-linux-gnu (on an aarch64
# machine it is the plain native build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
base=${EDGELLM_BASE:-}
base_version=
prefix=
while [ $# -gt 0 ]; do
  case "$1" in
    --target) export EDGELLM_TARGET=${2:?--target needs a Rust target triple}; shift 2 ;;
    --base) base=${2:?--base needs pypi, none or a path}; shift 2 ;;
    --base=*) base=${1#--base=}; shift ;;
    --base-version) base_version=${2:?--base-version needs a version}; shift 2 ;;
    --base-version=*) base_version=${1#--base-version=}; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    *) prefix=$1; shift ;;
  esac
done
target=${EDGELLM_TARGET:-}
[ "$target" = "$(uname -m)-unknown-linux-gnu" ] && target=
suffix=${target:+-${target%%-*}}
arch=${target%%-*}
arch=${arch:-$(uname -m)}
implicit=
if [ -z "$base" ]; then
  base=pypi implicit=1
  if [ "$arch" != x86_64 ] && [ "$arch" != aarch64 ]; then
    echo "install.sh: the tensorrt-edgellm wheel has no $arch payload: installing without a base (--base PATH adds your Edge-LLM build)" >&2
    base=none
  fi
fi
prefix=$(realpath -m "${prefix:-${EDGELLM_PREFIX:-$root/dist$suffix}}")
eval "$("$root/tools/setup.sh")"
build=${EDGELLM_BUILD_DIR:-$root/build$suffix}
args=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=$prefix")
case "$base" in
  none) args+=(-DEDGELLM_BASE_LIBRARY= -DEDGELLM_BASE_REVISION=unknown) ;;
  pypi)
    # The wheel of the target's CPU; a cross build has no target machine to probe for the payload.
    cross=0
    [ "$arch" = "$(uname -m)" ] || cross=1
    rc=0
    found=$(EDGELLM_BASE_ARCH=$arch EDGELLM_BASE_CROSS=$cross "$root/tools/edgellm_base.sh" ${EDGELLM_BASE_VARIANT:-}) || rc=$?
    if [ "$rc" = 3 ] && [ -n "$implicit" ]; then
      echo "install.sh: installing without a base (--base PATH adds your Edge-LLM build, EDGELLM_BASE_VARIANT names a payload)" >&2
      args+=(-DEDGELLM_BASE_LIBRARY= -DEDGELLM_BASE_REVISION=unknown)
    elif [ "$rc" != 0 ]; then
      exit "$rc"
    else
      eval "$found"
      echo "install.sh: base: Edge-LLM $EDGELLM_BASE_VERSION's $EDGELLM_BASE_VARIANT payload of the tensorrt-edgellm wheel" >&2
      args+=("-DEDGELLM_BASE_LIBRARY=$EDGELLM_BASE_LIBRARY" "-DEDGELLM_BASE_REVISION=$EDGELLM_BASE_REVISION")
      base_version=${base_version:-$EDGELLM_BASE_VERSION}
    fi ;;
  *)
    [ -f "$base" ] || { echo "install.sh: --base $base: no such file" >&2; exit 2; }
    args+=("-DEDGELLM_BASE_LIBRARY=$(realpath "$base")" -DEDGELLM_BASE_REVISION=unknown) ;;
esac
args+=("-DEDGELLM_BASE_VERSION=${base_version:-0.11.0}")
[ -n "${EDGELLM_CUDA_ARCHS:-}" ] && args+=("-DEDGELLM_CUDA_ARCHS=$EDGELLM_CUDA_ARCHS")
if [ -n "$target" ]; then
  args+=("-DCMAKE_TOOLCHAIN_FILE=$root/cmake/toolchains/aarch64-linux-gnu.cmake"
    "-DEDGELLM_CUDART_STATIC=$EDGELLM_TARGET_CUDART_STATIC" "-DGTest_DIR=$EDGELLM_TARGET_GTEST_DIR")
fi
cmake -S "$root" -B "$build" "${args[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)"
cmake --install "$build" >/dev/null
echo "installed into $prefix: $(ls "$prefix/lib" | tr '\n' ' ')"
