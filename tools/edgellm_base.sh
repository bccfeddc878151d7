#!/usr/bin/env bash
# Edge-LLM's own plugin library, the overlay's base, from the pinned tensorrt-edgellm wheel on PyPI
# (downloaded once into the toolchain cache, checked against its SHA-256). Prints the environment
# to use: eval "$(tools/edgellm_base.sh [VARIANT])" sets
#   EDGELLM_BASE_LIBRARY   the payload's libNvInfer_edgellm_plugin.so
#   EDGELLM_BASE_VERSION   the Edge-LLM version (0.11.0)
#   EDGELLM_BASE_REVISION  the Edge-LLM source revision the wheel was built from
#   EDGELLM_BASE_WHEEL     the wheel itself
# VARIANT is a payload of the wheel (its _native/variants.json); the default follows the TensorRT
# major version (EDGELLM_TRT_MAJOR, default 10): x86-ubuntu2204-cu13-sm80 for TensorRT 10 (glibc
# 2.35), x86-ubuntu2404-cu13-sm80-trt11 for TensorRT 11 (glibc 2.39). The wheel holds x86-64
# payloads only: on other machines pass an Edge-LLM build of your own (tools/install.sh --base PATH).
set -euo pipefail
version=0.11.0
wheel_name=tensorrt_edgellm-$version-cp311-cp311-manylinux_2_35_x86_64.whl
wheel_sha256=2cef657ced3a30b6d03d5c4b1ad511a707f77b64d7f59d5e1dd117de8ceb8f50
cache=${EDGELLM_TOOLCHAIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgellm-allreduce}/tensorrt-edgellm-$version
say() { echo "edgellm_base: $*" >&2; }

if [ "$(uname -m)" != x86_64 ]; then
  say "the tensorrt-edgellm $version wheel has x86-64 payloads only: pass --base PATH to tools/install.sh"
  exit 1
fi
case "${EDGELLM_TRT_MAJOR:-10}" in
  10) default=x86-ubuntu2204-cu13-sm80 ;;
  11) default=x86-ubuntu2404-cu13-sm80-trt11 ;;
  *) say "EDGELLM_TRT_MAJOR must be 10 or 11"; exit 1 ;;
esac
variant=${1:-$default}

wheel=$cache/$wheel_name
if [ ! -f "$wheel" ]; then
  say "downloading $wheel_name from PyPI (about 200 MB, once)"
  rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp --platform manylinux_2_35_x86_64 \
    -d "$cache.tmp" "tensorrt-edgellm==$version" >&2
  echo "$wheel_sha256  $cache.tmp/$wheel_name" | sha256sum -c --quiet - >&2 || { say "SHA-256 mismatch"; exit 1; }
  mkdir -p "$cache" && mv "$cache.tmp/$wheel_name" "$wheel" && rm -rf "$cache.tmp"
fi

# The variant's plugin library and the manifest's facts, extracted once per variant.
out=$cache/payloads/$variant
if [ ! -f "$out/libNvInfer_edgellm_plugin.so" ]; then
  python3 - "$wheel" "$variant" "$out" <<'PY' || exit 1
import json, os, sys, zipfile
wheel, variant, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    manifest = json.loads(z.read("tensorrt_edgellm/_native/variants.json"))
    rows = {v["variant_id"]: v for v in manifest["variants"]}
    if variant not in rows:
        sys.exit(f"edgellm_base: no payload {variant!r} in the wheel; it has: {', '.join(sorted(rows))}")
    os.makedirs(out + ".tmp", exist_ok=True)
    with open(out + ".tmp/libNvInfer_edgellm_plugin.so", "wb") as f:
        f.write(z.read("tensorrt_edgellm/" + rows[variant]["plugin"]))
    with open(out + ".tmp/revision", "w") as f:
        f.write(rows[variant]["source_revision"] + "\n")
os.replace(out + ".tmp", out)
PY
fi
echo "export EDGELLM_BASE_LIBRARY='$out/libNvInfer_edgellm_plugin.so'"
echo "export EDGELLM_BASE_VERSION='$version'"
echo "export EDGELLM_BASE_REVISION='$(cat "$out/revision")'"
echo "export EDGELLM_BASE_WHEEL='$wheel'"
