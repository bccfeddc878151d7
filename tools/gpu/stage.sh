#!/usr/bin/env bash
# Copies the built library and test binaries into .carry/ (git-ignored) for the device tool's
# `carry`, stripped. Run after tools/install.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/.carry"
cp -L "$root/build/libNvInfer_edgellm_plugin.so.1" "$root/build"/tests/edgellm_plugin_tests_trt* "$root/.carry/"
strip "$root/.carry"/edgellm_plugin_tests_trt*
du -sh "$root/.carry"
