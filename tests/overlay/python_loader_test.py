#!/usr/bin/env python3
"""tensorrt_edgellm's own loader on an installed package with the overlay put under it.

The wheel is installed once (pip --target, no dependencies) under --work/site; each run works on a
hard-linked copy (tools/python_overlay.py replaces files by rename, so the copy's changes never
reach the installed one). In a fresh interpreter the package's load_runtime() then selects the
TensorRT 10 payload (the platform is given, as this machine has no GPU), checks the SHA-256 of the
plugin against variants.json, sets EDGELLM_PLUGIN_PATH and loads the plugin RTLD_GLOBAL | RTLD_NOW.
Only the extension import is left out: it needs TensorRT itself. TensorRT's registry is the
stand-in libnvinfer.so.10 (LD_LIBRARY_PATH), loaded RTLD_LOCAL first, as TensorRT's Python bindings
load theirs. Exit 77 (skipped) where the wheel's Python (3.11) is not the one running.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import ctypes, json, os, sys, types
sys.path.insert(0, sys.argv[1])
registry = ctypes.CDLL("libnvinfer.so.10")  # RTLD_LOCAL, as TensorRT's Python bindings load it
from tensorrt_edgellm._native import detect, load
load._import_extension = lambda path: types.ModuleType("tensorrt_edgellm._edgellm_runtime")
platform = detect.DetectedPlatform(python_abi="cp311", platform_probe_source="os-release",
    platform_probe_value="ubuntu:22.04", cpu_arch="x86_64", cuda_runtime_soname="libcudart.so.13",
    tensorrt_runtime_soname="libnvinfer.so.10", gpu_sm=80)
load.load_runtime(detector=lambda: platform)
registry.fakeRegistryOwner.restype = ctypes.c_char_p
owner = lambda name: os.path.realpath(registry.fakeRegistryOwner(name.encode(), b"").decode() or "/none")
plugin = os.environ["EDGELLM_PLUGIN_PATH"]
glob = ctypes.CDLL(None)
ours = ctypes.CDLL(plugin, mode=os.RTLD_NOLOAD)
address = lambda lib: ctypes.cast(lib.edgellmRegisterNcclCommForAllReducePlugin, ctypes.c_void_p).value
print(json.dumps({
    "plugin": os.path.realpath(plugin),
    "creators": registry.fakeRegistryCount(b""),
    "refusals": registry.fakeRegistryRefusals(),
    "AllReducePlugin": owner("AllReducePlugin"),
    "RmsNormPlugin": owner("RmsNormPlugin"),
    "global_is_plugin": address(glob) == address(ours),
}))
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_in_child(scratch: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("EDGELLM_PLUGIN_PATH", "EDGELLM_ALLREDUCE_BASE_LIBRARY")}
    done = subprocess.run([sys.executable, "-c", CHILD, str(scratch)], env=env, capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"FAIL: the package's loader failed (rc {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(condition: bool, what: str) -> None:
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--library", type=Path, required=True)
    parser.add_argument("--tool", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    if sys.version_info[:2] != (3, 11):
        print(f"skipped: the tensorrt-edgellm wheel is for Python 3.11, this is {sys.version.split()[0]}")
        sys.exit(77)

    site = args.work / "site"
    if not site.is_dir():
        shutil.rmtree(args.work / "site.tmp", ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-compile", "--target", str(args.work / "site.tmp"), str(args.wheel)], check=True)
        os.replace(args.work / "site.tmp", site)
    scratch = args.work / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run(["cp", "-al", str(site), str(scratch)], check=True)
    pkg = scratch / "tensorrt_edgellm"
    payload = pkg / "_native/payloads/x86-ubuntu2204-cu13-sm80/lib"
    pristine = {p.relative_to(scratch): sha256(p) for p in scratch.glob("tensorrt_edgellm*/**/*")
                if p.is_file() and (p.name in ("variants.json", "RECORD") or p.name.startswith("libNvInfer_edgellm_plugin"))}

    tool = [sys.executable, str(args.tool)]
    # All or nothing: with one payload not the package's own (the last one listed), install
    # refuses before it touches any.
    manifest = json.loads((pkg / "_native/variants.json").read_text())
    last = pkg / manifest["variants"][-1]["plugin"]
    saved = last.with_name(last.name + ".saved")
    os.replace(last, saved)  # the scratch tree hard-links the site's files: never written in place
    last.write_bytes(saved.read_bytes() + b"altered")
    refused = subprocess.run(tool + ["install", "--package", str(pkg), "--library", str(args.library)])
    os.replace(saved, last)
    now = {p.relative_to(scratch): sha256(p) for p in scratch.glob("tensorrt_edgellm*/**/*")
           if p.is_file() and (p.name in ("variants.json", "RECORD") or p.name.startswith("libNvInfer_edgellm_plugin"))}
    check(refused.returncode != 0 and now == pristine and not (pkg / "_native/edgellm_allreduce_overlay.json").exists(),
          "an install that must refuse one payload changes none")

    subprocess.run(tool + ["install", "--package", str(pkg), "--library", str(args.library)], check=True)
    state = load_in_child(scratch)
    print(json.dumps(state, indent=2))
    check(state["plugin"] == str((payload / "libNvInfer_edgellm_plugin.so").resolve()),
          "the loader selected and verified the payload's plugin, now ours")
    check(sha256(payload / "libNvInfer_edgellm_plugin.so") == sha256(args.library), "that file is ours")
    check(state["creators"] == 24, "all 24 of Edge-LLM 0.11's creators are registered")
    check(state["refusals"] == 0, "no duplicate registration")
    check(state["AllReducePlugin"] == state["plugin"], "ours serves AllReducePlugin")
    check(state["RmsNormPlugin"] == str((payload / "libNvInfer_edgellm_plugin_base.so").resolve()),
          "Edge-LLM's library, kept beside ours as the base, serves the others")
    check(state["global_is_plugin"], "dlsym(RTLD_DEFAULT, edgellmRegisterNcclCommForAllReducePlugin) is ours")

    subprocess.run(tool + ["install", "--package", str(pkg), "--library", str(args.library)], check=True)
    check(sha256(payload / "libNvInfer_edgellm_plugin_base.so") == pristine[
        (payload / "libNvInfer_edgellm_plugin.so").relative_to(scratch)], "a second install keeps Edge-LLM's library as the base")
    status = subprocess.run(tool + ["status", "--package", str(pkg)], check=True, capture_output=True, text=True).stdout
    check(status.count("edgellm-allreduce") == 8, "status: every payload is the overlay")

    subprocess.run(tool + ["revert", "--package", str(pkg)], check=True)
    after = {p.relative_to(scratch): sha256(p) for p in scratch.glob("tensorrt_edgellm*/**/*")
             if p.is_file() and (p.name in ("variants.json", "RECORD") or p.name.startswith("libNvInfer_edgellm_plugin"))}
    check(after == pristine, "revert restores every library, variants.json and RECORD byte for byte")
    check(not any(scratch.rglob("*.edgellm-allreduce-original")) and not (pkg / "_native/edgellm_allreduce_overlay.json").exists(),
          "revert leaves nothing of the overlay behind")
    state = load_in_child(scratch)
    check(state["AllReducePlugin"] == state["plugin"] and state["creators"] == 24,
          "after revert the package loads Edge-LLM's own library again")
    shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
