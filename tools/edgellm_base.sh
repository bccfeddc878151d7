#!/usr/bin/env bash
# Edge-LLM's own plugin library, the overlay's base, from the pinned tensorrt-edgellm wheel on PyPI
# (downloaded once into the toolchain cache, checked against its SHA-256). Prints the environment
# to use: eval "$(tools/edgellm_base.sh [VARIANT])" sets
#   EDGELLM_BASE_LIBRARY   the payload's libNvInfer_edgellm_plugin.so
#   EDGELLM_BASE_VERSION   the Edge-LLM version (0.11.0)
#   EDGELLM_BASE_REVISION  the Edge-LLM source revision the wheel was built from
#   EDGELLM_BASE_VARIANT   the payload
#   EDGELLM_BASE_WHEEL     the wheel itself
# VARIANT is a payload of the wheel (its _native/variants.json). The wheel is the one of the CPU
# (EDGELLM_BASE_ARCH, default: this machine's):
#   x86_64   (manylinux_2_35, ~200 MB) the default follows the TensorRT major (EDGELLM_TRT_MAJOR,
#            default 10): x86-ubuntu2204-cu13-sm80 for TensorRT 10 (glibc 2.35),
#            x86-ubuntu2404-cu13-sm80-trt11 for TensorRT 11 (glibc 2.39)
#   aarch64  (manylinux_2_39, ~430 MB; TensorRT 10 only) the payload of the platform, chosen by
#            tools/edgellm_variant.py from the GPU (nvidia-smi), the L4T / DRIVE OS release and the
#            device model: DGX Spark, Jetson Thor (JetPack 7.0, 7.1, 7.2), DRIVE Thor, IGX Thor,
#            Jetson Orin (JetPack 7.2). EDGELLM_BASE_CROSS=1 (a cross build: the machine is not the
#            target) takes the default, dgx-spark-cu13-sm121. Exit 3 when no payload fits.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=0.11.0
cache=${EDGELLM_TOOLCHAIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgellm-allreduce}/tensorrt-edgellm-$version
say() { echo "edgellm_base: $*" >&2; }

arch=${EDGELLM_BASE_ARCH:-$(uname -m)}
case "$arch" in
  x86_64)
    platform=manylinux_2_35_x86_64
    wheel_sha256=2cef657ced3a30b6d03d5c4b1ad511a707f77b64d7f59d5e1dd117de8ceb8f50 size="about 200 MB"
    case "${EDGELLM_TRT_MAJOR:-10}" in
      10) default=x86-ubuntu2204-cu13-sm80 ;;
      11) default=x86-ubuntu2404-cu13-sm80-trt11 ;;
      *) say "EDGELLM_TRT_MAJOR must be 10 or 11"; exit 1 ;;
    esac ;;
  aarch64)
    platform=manylinux_2_39_aarch64
    wheel_sha256=21a66a57de5264bcf24e3e699e3e7b660e9541409d978cb5e76fe92e890b9c33 size="about 430 MB"
    default= # chosen from the manifest below
    if [ "${EDGELLM_TRT_MAJOR:-10}" != 10 ]; then
      say "the tensorrt-edgellm $version wheel's aarch64 payloads are for TensorRT 10 only"; exit 1
    fi ;;
  *) say "the tensorrt-edgellm $version wheel has no $arch payloads: pass --base PATH to tools/install.sh"; exit 1 ;;
esac
wheel_name=tensorrt_edgellm-$version-cp311-cp311-$platform.whl
variant=${1:-$default}

wheel=$cache/$wheel_name
if [ ! -f "$wheel" ]; then
  say "downloading $wheel_name from PyPI ($size, once)"
  rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp --platform "$platform" \
    -d "$cache.tmp" "tensorrt-edgellm==$version" >&2
  echo "$wheel_sha256  $cache.tmp/$wheel_name" | sha256sum -c --quiet - >&2 || { say "SHA-256 mismatch"; exit 1; }
  mkdir -p "$cache" && mv "$cache.tmp/$wheel_name" "$wheel" && rm -rf "$cache.tmp"
fi

if [ -z "$variant" ]; then # aarch64: the platform's payload, from the manifest
  mkdir -p "$cache"
  manifest=$cache/variants-$platform.json
  if [ ! -f "$manifest" ]; then
    python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("tensorrt_edgellm/_native/variants.json"))' \
      "$wheel" >"$manifest.tmp"
    mv "$manifest.tmp" "$manifest"
  fi
  cross=()
  [ "${EDGELLM_BASE_CROSS:-}" != 1 ] || cross=(--cross)
  variant=$(python3 "$root/tools/edgellm_variant.py" "$manifest" ${cross[@]+"${cross[@]}"}) || exit $?
fi

# The variant's plugin library and the manifest's facts, extracted once per variant; the plugin is
# checked against the manifest's SHA-256.
out=$cache/payloads/$variant
if [ ! -f "$out/libNvInfer_edgellm_plugin.so" ]; then
  python3 - "$wheel" "$variant" "$out" <<'PY' || exit 1
import hashlib, json, os, sys, zipfile
wheel, variant, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    manifest = json.loads(z.read("tensorrt_edgellm/_native/variants.json"))
    rows = {v["variant_id"]: v for v in manifest["variants"]}
    if variant not in rows:
        sys.exit(f"edgellm_base: no payload {variant!r} in the wheel; it has: {', '.join(sorted(rows))}")
    plugin = z.read("tensorrt_edgellm/" + rows[variant]["plugin"])
    if hashlib.sha256(plugin).hexdigest() != rows[variant]["plugin_sha256"]:
        sys.exit(f"edgellm_base: {variant}'s plugin does not match the manifest's SHA-256")
    os.makedirs(out + ".tmp", exist_ok=True)
    with open(out + ".tmp/libNvInfer_edgellm_plugin.so", "wb") as f:
        f.write(plugin)
    with open(out + ".tmp/revision", "w") as f:
        f.write(rows[variant]["source_revision"] + "\n")
    with open(out + ".tmp/sha256", "w") as f:
        f.write(rows[variant]["plugin_sha256"] + "\n")
os.replace(out + ".tmp", out)
PY
fi
if [ ! -f "$out/sha256" ]; then # extracted before the manifest's SHA-256 was kept beside it
  python3 -c 'import json, sys, zipfile
rows = json.loads(zipfile.ZipFile(sys.argv[1]).read("tensorrt_edgellm/_native/variants.json"))["variants"]
print(next(r["plugin_sha256"] for r in rows if r["variant_id"] == sys.argv[2]))' "$wheel" "$variant" >"$out/sha256.tmp"
  mv "$out/sha256.tmp" "$out/sha256"
fi
echo "export EDGELLM_BASE_LIBRARY='$out/libNvInfer_edgellm_plugin.so'"
echo "export EDGELLM_BASE_VERSION='$version'"
echo "export EDGELLM_BASE_REVISION='$(cat "$out/revision")'"
echo "export EDGELLM_BASE_VARIANT='$variant'"
echo "export EDGELLM_BASE_WHEEL='$wheel'"
