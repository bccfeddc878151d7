#!/usr/bin/env python3
"""The installed library loaded as Edge-LLM 0.11's direct builder loads it with --plugin-path.

tensorrt-edgellm-build (experimental/builder) imports tensorrt, whose bindings load libnvinfer
RTLD_LOCAL, then core/builder.py load_plugin_library(path) checks that the file exists and runs
ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL): no SHA-256 check, no initEdgellmPlugins call. The
network's plugin layers then find their creators with
trt.get_plugin_registry().get_creator(name, "1", "") (ops/backend.py). Here TensorRT's registry is
the stand-in libnvinfer.so.<major> (../cpp/fake_tensorrt.*; found on LD_LIBRARY_PATH, as the other
overlay tests find it), so this checks what get_creator would return after that one load.
With --wheel, the wheel's builder is read first, so that a change to how it loads the library fails
here rather than passing unnoticed.

Usage: direct_builder_test.py --library LIB --creators N [--base BASE] [--wheel WHEEL] [--standin libnvinfer.so.10]
"""

import argparse
import ctypes
import os
import sys
import zipfile


def check(condition: bool, what: str) -> None:
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", required=True, help="the plugin library, as --plugin-path names it")
    parser.add_argument("--creators", type=int, required=True, help="creators the load must leave registered")
    parser.add_argument("--base", help="the file whose creators serve the others (RmsNormPlugin)")
    parser.add_argument("--wheel", help="a tensorrt-edgellm 0.11 wheel, whose builder is read first")
    parser.add_argument("--standin", default="libnvinfer.so.10", help="TensorRT's registry: the stand-in")
    args = parser.parse_args()

    if args.wheel:
        with zipfile.ZipFile(args.wheel) as z:
            builder = z.read("experimental/builder/core/builder.py").decode()
            cli = z.read("experimental/builder/cli.py").decode()
            backend = z.read("experimental/builder/ops/backend.py").decode()
        check("handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)" in builder,
              "the wheel's builder loads --plugin-path with ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)")
        check("plugin_handle = load_plugin_library(plugin_path)" in cli and "initEdgellmPlugins" not in builder + cli,
              "and calls nothing in it (no initEdgellmPlugins)")
        check('registry.get_creator(creator_name, "1", "")' in backend,
              "its plugin layers find creators with get_creator(name, \"1\", \"\")")

    registry = ctypes.CDLL(args.standin)  # import tensorrt: its bindings load libnvinfer RTLD_LOCAL
    # load_plugin_library(path), as in the wheel's core/builder.py
    path = args.library
    check(os.path.exists(path), f"{path} exists (load_plugin_library checks)")
    handle = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)

    registry.fakeRegistryOwner.restype = ctypes.c_char_p
    owner = lambda name: os.path.realpath(registry.fakeRegistryOwner(name.encode(), b"").decode() or "/none")
    ours = os.path.realpath(path)
    check(owner("AllReducePlugin") == ours, f"get_creator('AllReducePlugin', '1', '') is ours ({ours})")
    count = registry.fakeRegistryCount(b"")
    check(count == args.creators, f"creators registered: {count} (expected {args.creators})")
    check(registry.fakeRegistryRefusals() == 0, "no duplicate registration")
    if args.base:
        check(owner("RmsNormPlugin") == os.path.realpath(args.base), f"RmsNormPlugin is the base's ({owner('RmsNormPlugin')})")
    address = lambda lib: ctypes.cast(lib.edgellmRegisterNcclCommForAllReducePlugin, ctypes.c_void_p).value
    check(address(ctypes.CDLL(None)) == address(handle),
          "dlsym(RTLD_DEFAULT, edgellmRegisterNcclCommForAllReducePlugin) is ours")


if __name__ == "__main__":
    main()
