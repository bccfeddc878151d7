#!/usr/bin/env python3
"""Lists the kernel images inside the built library with cuobjdump and checks them against the
build's EDGELLM_CUDA_ARCHS: every fatbin (one per kernels/*.cu) holds SASS for each listed
architecture and PTX of the lowest and of the newest, nothing else.

Usage: kernel_images.py LIBRARY CUOBJDUMP KERNELS_DIR "ARCHS"   (ARCHS as in CMake: "80;90")
       kernel_images.py --sizes LIBRARY   (bytes each image adds to the library, over all fatbins)

The fatbins are embedded as plain data (include_bytes!), not in a .nv_fatbin section, so they
are cut out of the library at their magic number, each by its own header's size, then handed to
cuobjdump --list-elf --list-ptx.
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

FATBIN_MAGIC = 0xBA55ED50


def fatbins(data):
    """Each embedded fatbin: magic, version 1, header size 16, then the size of what follows."""
    found, at = [], 0
    while (at := data.find(struct.pack("<I", FATBIN_MAGIC), at)) >= 0:
        _, version, header, size = struct.unpack_from("<IHHQ", data, at)
        if version == 1 and header == 16 and at + header + size <= len(data):
            found.append(data[at : at + header + size])
            at += header + size
        else:
            at += 4
    return found


def entry_sizes(blob):
    """(image, bytes) of each entry of a fatbin: kind 1 PTX, 2 ELF; the arch at offset 28."""
    at = 16
    while at < len(blob):
        kind, _, header, size = struct.unpack_from("<HHIQ", blob, at)
        arch = struct.unpack_from("<I", blob, at + 28)[0]
        yield ("compute_" if kind == 1 else "sm_") + str(arch), header + size
        at += header + size


def print_sizes(library):
    with open(library, "rb") as f:
        data = f.read()
    totals = {}
    for blob in fatbins(data):
        for image, size in entry_sizes(blob):
            totals[image] = totals.get(image, 0) + size
    key = lambda i: (i.startswith("compute_"), int(i.split("_")[1]))
    for image in sorted(totals, key=key):
        print(f"{image:12} {totals[image]:>10} bytes")
    print(f"{'library':12} {len(data):>10} bytes")


def images(cuobjdump, blob, folder, n):
    path = os.path.join(folder, f"module{n}.fatbin")
    with open(path, "wb") as f:
        f.write(blob)
    out = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", path], check=True, capture_output=True, text=True).stdout
    # "ELF file    1: module0.1.sm_90.cubin", "PTX file    1: module0.1.sm_80.ptx"
    sass = {f"sm_{a}" for a in re.findall(r"^ELF file\s+\d+: .*\.sm_(\d+)\.cubin$", out, re.M)}
    ptx = {f"compute_{a}" for a in re.findall(r"^PTX file\s+\d+: .*\.sm_(\d+)\.ptx$", out, re.M)}
    return sass, ptx, out


def main():
    if sys.argv[1] == "--sizes":
        print_sizes(sys.argv[2])
        return 0
    library, cuobjdump, kernels_dir, archs = sys.argv[1:5]
    archs = sorted({int(a) for a in re.split(r"[;, ]+", archs) if a})
    want_sass = {f"sm_{a}" for a in archs}
    want_ptx = {f"compute_{archs[0]}", f"compute_{archs[-1]}"}
    modules = sorted(f for f in os.listdir(kernels_dir) if f.endswith(".cu"))
    with open(library, "rb") as f:
        blobs = fatbins(f.read())
    failures = []
    if len(blobs) != len(modules):
        failures.append(f"{len(blobs)} fatbins in {library}, expected {len(modules)} (one per {', '.join(modules)})")
    with tempfile.TemporaryDirectory() as folder:
        for n, blob in enumerate(blobs):
            sass, ptx, listing = images(cuobjdump, blob, folder, n)
            print(f"fatbin {n}: {len(blob)} bytes: {' '.join(sorted(sass))} {' '.join(sorted(ptx))}")
            if sass != want_sass or ptx != want_ptx:
                failures.append(
                    f"fatbin {n} holds SASS {sorted(sass)} and PTX {sorted(ptx)}, expected {sorted(want_sass)} and {sorted(want_ptx)}:\n{listing}"
                )
    if failures:
        print("FAIL: " + "\nFAIL: ".join(failures))
        return 1
    print(f"kernel images: {len(blobs)} fatbins, each SASS {' '.join(sorted(want_sass))} + PTX {' '.join(sorted(want_ptx))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
