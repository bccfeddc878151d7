#!/usr/bin/env bash
# Builds what tools/gpu/no_image_check.sh runs on a GPU machine with an sm_90 GPU (H100/H200),
# into .carry/kernel-images/ (git-ignored; carry that folder):
#   none/  the library and the Rust kernel test built for sm_100 only (SASS and PTX of
#          compute_100): no image an sm_90 can run;
#   jit/   the same built for sm_80 only: an sm_90 runs the PTX of compute_80, JIT-compiled
#          (the lowest-arch PTX that lets a GPU newer than the list run every kernel);
# each with the gtest suite (TensorRT 10 build, with its stand-in libnvinfer; it dlopens the
# library it is given).
# Run after tools/install.sh (the gtest binary comes from build/).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
eval "$("$root/tools/setup.sh")"
dest="$root/.carry/kernel-images"
rm -rf "$dest"
for variant in none:100 jit:80; do
  name=${variant%%:*} archs=${variant#*:}
  tests=(gpu_kernel_images)
  [ "$name" = jit ] && tests+=(gpu_simulated_ranks)
  build="$root/build-gpu-$name"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF "-DEDGELLM_CUDA_ARCHS=$archs" >/dev/null
  cmake --build "$build" --target NvInfer_edgellm_plugin >/dev/null
  mkdir -p "$dest/$name/trt10"
  cp -L "$build/libNvInfer_edgellm_plugin.so.1" "$root/build/tests/edgellm_plugin_tests_trt10" "$dest/$name/"
  cp -L "$root/build/tests/trt10/libnvinfer.so.10" "$dest/$name/trt10/" # the gtest's stand-in TensorRT
  list=$(cd "$root" && EDGELLM_CUDA_ARCHS=$archs cargo test --release --no-run "${tests[@]/#/--test=}" 2>&1)
  for test in "${tests[@]}"; do
    cp "$root/$(grep -oP "Executable tests/$test.rs \(\K[^)]+" <<<"$list")" "$dest/$name/rust_$test"
  done
  strip "$dest/$name"/edgellm_plugin_tests_trt10 "$dest/$name"/rust_*
  python3 "$root/tests/kernel_images.py" "$dest/$name/libNvInfer_edgellm_plugin.so.1" "$EDGELLM_CUOBJDUMP" "$root/kernels" "$archs" |
    tail -n1 >"$dest/$name/IMAGES"
done
du -sh "$dest"
