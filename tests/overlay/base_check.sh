#!/usr/bin/env bash
# Checks the base the package installed (lib/libNvInfer_edgellm_plugin_base.so) without loading
# it, so that a cross build's is checked too: it is the file the build was given (for a PyPI base,
# the payload whose SHA-256 the wheel's manifest names), an ELF64 library of the target's CPU, the
# same as ours, and its imports (DT_NEEDED) are those the overlay expects of Edge-LLM's library:
# one libnvinfer.so.10 or .11 (src/overlay/ reads it to refuse a base of another TensorRT
# major), the CUDA 13 runtime, the target's dynamic loader, and nothing beyond the CUDA driver,
# NVRTC and the C/C++ runtime.
# Usage: base_check.sh PREFIX SOURCE ARCH   (SOURCE: the base the build was given, "" for none;
#        ARCH: the target's CPU, x86_64 or aarch64). READELF names the target's readelf.
set -euo pipefail
prefix=$1 source=$2 arch=$3
readelf=${READELF:-readelf}
ours="$prefix/lib/libNvInfer_edgellm_plugin.so.1.0"
base="$prefix/lib/libNvInfer_edgellm_plugin_base.so"
fail() { echo "FAIL: $*"; exit 1; }

case "$arch" in
  x86_64) machine="Advanced Micro Devices X86-64" loader=ld-linux-x86-64.so.2 ;;
  aarch64) machine=AArch64 loader=ld-linux-aarch64.so.1 ;;
  *) fail "unknown target CPU $arch" ;;
esac
header() { "$readelf" -h "$1" | sed -n "s/^ *$2: *//p"; }
[ "$(header "$ours" Machine)" = "$machine" ] || fail "ours is built for $(header "$ours" Machine), not $arch"

if [ -z "$source" ]; then
  [ ! -e "$base" ] || fail "the build was given no base, but $base is installed"
  echo "base_check: no base (the build was given none)"
  exit 0
fi
[ -f "$base" ] || fail "the build was given the base $source, but $base is not installed"
cmp -s "$base" "$source" || fail "$base is not the file the build was given ($source)"
if [ -f "$(dirname "$source")/sha256" ]; then # a payload of the PyPI wheel (tools/edgellm_base.sh)
  expected=$(cat "$(dirname "$source")/sha256")
  [ "$(sha256sum "$base" | cut -d' ' -f1)" = "$expected" ] || fail "$base's SHA-256 is not the wheel manifest's ($expected)"
  from="$(basename "$(dirname "$source")") payload, SHA-256 $expected as the wheel's manifest says"
else
  from=$source
fi

[ "$(header "$base" Class)" = ELF64 ] || fail "the base is $(header "$base" Class), the overlay reads ELF64 only"
[ "$(header "$base" Machine)" = "$machine" ] || fail "the base is built for $(header "$base" Machine), ours for $machine"
[ "$(header "$base" Type | cut -d' ' -f1)" = DYN ] || fail "the base is not a shared library"
dyn=$("$readelf" -d "$base")
grep -q 'SONAME.*\[libNvInfer_edgellm_plugin.so.1\]' <<<"$dyn" || fail "the base's SONAME is not libNvInfer_edgellm_plugin.so.1"
needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn")
tensorrt=$(grep -E '^libnvinfer\.so\.' <<<"$needed" || true)
[ "$(wc -w <<<"$tensorrt")" = 1 ] || fail "the base imports $(wc -w <<<"$tensorrt") TensorRT runtimes ($tensorrt), the overlay expects one"
grep -qxE 'libnvinfer\.so\.1[01]' <<<"$tensorrt" || fail "the base imports $tensorrt: the overlay serves TensorRT 10 and 11"
grep -qx libcudart.so.13 <<<"$needed" || fail "the base does not import the CUDA 13 runtime (libcudart.so.13)"
grep -qx "$loader" <<<"$needed" || fail "the base does not import $arch's dynamic loader $loader: $(tr '\n' ' ' <<<"$needed")"
unexpected=$(grep -vxE "libnvinfer\.so\.1[01]|libcudart\.so\.13|libcuda\.so\.1|libnvrtc\.so\.13|libstdc\+\+\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libc\.so\.6|$loader" <<<"$needed" || true)
[ -z "$unexpected" ] || fail "the base imports what the overlay does not expect: $(tr '\n' ' ' <<<"$unexpected")"
glibc=$("$readelf" -V "$base" | grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sort -uV | tail -1)
echo "base_check: $base is the $from; ELF64 $machine like ours; imports $(tr '\n' ' ' <<<"$needed")(needs $glibc)"
