#!/usr/bin/env python3
"""Which aarch64 payload of the tensorrt-edgellm wheel is the overlay's base on this machine.

The wheel's _native/variants.json lists one row per payload and GPU: its GPU (gpu_sm) and the
platform marker Edge-LLM's own loader probes (platform_probe_source / platform_probe_values):
"l4t" (the L4T release of /etc/nv_tegra_release, e.g. R38.2 = JetPack 7.0), "driveos"
(/etc/driveos-release) or "device-model" (/proc/device-tree/model or the DMI product name, e.g.
"DGX Spark", "NVIDIA IGX Thor"). choose() is a pure function of those rows and the machine's
facts; probe() reads the facts (nvidia-smi --query-gpu=compute_cap for the GPUs).

The order, most specific first:
  1. a DRIVE OS release: the driveos payload of that release (else the newest not newer);
  2. a device model one of the rows names (IGX Thor, DGX Spark / GB10): that row's payload;
  3. an L4T release (Jetson): the l4t payload for the GPU (its SM, else from the model: Orin 87,
     Thor 110) of that release, else the newest of the same L4T major that is not newer;
  4. a GPU alone: the payload of that SM (for several, the l4t row of the newest release);
  5. nothing at all (a build machine, a cross build): DEFAULT, said so.
None (with the reason) when no payload fits: a Grace machine with a data-center GPU, Orin on
JetPack 6, a release older than every payload.

Usage: edgellm_variant.py MANIFEST [--cross] [--sm N ...] [--l4t R38.2] [--driveos 7.2] [--model TEXT]
Prints the variant on stdout and why on stderr; exit 3 when none fits. Without any of --sm,
--l4t, --driveos, --model it probes this machine, unless --cross (no target machine to probe).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Tuple

# The documented default where there is no machine to look at: DGX Spark (GB10, sm_121), the one
# aarch64 platform Edge-LLM 0.11 documents tensor parallelism on (a pair of Sparks), where
# AllReducePlugin runs.
DEFAULT = "dgx-spark-cu13-sm121"

# Jetson modules whose GPU the device-tree model tells when nvidia-smi is absent (Orin's L4T).
MODEL_SMS = (("orin", 87), ("thor", 110))

Row = Mapping[str, object]


def release(text: str) -> Tuple[int, ...]:
    """'R38.2' or '7.2' as (38, 2) / (7, 2); () if it holds no number."""
    return tuple(int(n) for n in re.findall(r"\d+", text)[:2])


def _newest_not_newer(rows: Sequence[Row], wanted: str) -> Optional[Row]:
    """The row whose probe value is `wanted`, else the newest of the same major that is older."""
    target = release(wanted)
    best = None
    for row in rows:
        for value in row["platform_probe_values"]:
            have = release(str(value))
            if have == target:
                return row
            if have[:1] == target[:1] and have < target and (best is None or have > best[0]):
                best = (have, row)
    return best[1] if best else None


def _newest(rows: Sequence[Row]) -> Row:
    return max(rows, key=lambda row: max(release(str(v)) for v in row["platform_probe_values"]))


def choose(variants: Iterable[Row], sms: Sequence[int] = (), l4t: Optional[str] = None,
           driveos: Optional[str] = None, model: Optional[str] = None) -> Tuple[Optional[str], str]:
    """The payload for a machine with GPUs `sms`, L4T release `l4t`, DRIVE OS `driveos`, device
    model `model` (each may be unknown), and why; (None, why) when none fits."""
    rows = [row for row in variants if row.get("cpu_arch") == "aarch64"]
    by = lambda source: [row for row in rows if row["platform_probe_source"] == source]
    found = ", ".join(sorted({str(row["variant_id"]) for row in rows}))
    sms = sorted(set(sms))
    if driveos:
        row = _newest_not_newer(by("driveos"), driveos)
        if row is None:
            return None, f"DRIVE OS {driveos}: the wheel has DRIVE payloads for none older or equal ({found})"
        return str(row["variant_id"]), f"DRIVE OS {driveos}"
    if model:
        for row in by("device-model"):
            if any(str(v).casefold() in model.casefold() for v in row["platform_probe_values"]):
                return str(row["variant_id"]), f"device model '{model}'"
    if l4t:
        gpu = sms or [sm for name, sm in MODEL_SMS if model and name in model.casefold()][:1]
        if not gpu:
            return None, f"L4T {l4t} without a GPU to go by (no nvidia-smi, model '{model or ''}')"
        candidates = [row for row in by("l4t") if int(row["gpu_sm"]) in gpu]
        row = _newest_not_newer(candidates, l4t)
        if row is None:
            have = ", ".join(sorted(str(v) for r in candidates for v in r["platform_probe_values"])) or "none"
            return None, f"L4T {l4t}, sm_{gpu[0]}: the wheel's payloads for this GPU are for L4T {have}"
        return str(row["variant_id"]), f"L4T {l4t}, sm_{int(row['gpu_sm'])}"
    if sms:
        for sm in sms:
            candidates = [row for row in rows if int(row["gpu_sm"]) == sm]
            if candidates:
                l4t_rows = [row for row in candidates if row["platform_probe_source"] == "l4t"]
                row = _newest(l4t_rows) if l4t_rows else candidates[0]
                return str(row["variant_id"]), f"sm_{sm} (no platform release found)"
        return None, f"no payload for sm_{', sm_'.join(map(str, sms))} ({found})"
    return DEFAULT, "no GPU or platform marker to go by: the default"


def _read(path: str, root: Path = Path("/")) -> Optional[str]:
    try:
        return (root / path.lstrip("/")).read_text(encoding="utf-8", errors="replace").strip("\x00\n ")
    except OSError:
        return None


def probe(root: Path = Path("/"), run=subprocess.run) -> dict:
    """This machine's facts, as Edge-LLM's loader reads them (and nvidia-smi for the GPUs); `root`
    and `run` are for tests (a fake file system, a fake nvidia-smi)."""
    facts: dict = {"sms": []}
    try:
        out = run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                  capture_output=True, text=True, timeout=30).stdout
        facts["sms"] = [int(a) * 10 + int(b) for a, b in re.findall(r"(\d+)\.(\d+)", out)]
    except (OSError, subprocess.SubprocessError):
        pass
    drive = _read("/etc/driveos-release", root)
    if drive:
        match = re.search(r'^VERSION(?:_ID)?="?(\d+\.\d+)', drive, re.M)
    else:  # DRIVE OS without the release file: its rootfs version (as Edge-LLM's loader reads it)
        drive = _read("/etc/nvidia/version-ubuntu-rootfs.txt", root)
        match = re.search(r"\b(\d+\.\d+)(?:\.\d+)*\b", drive) if drive else None
    if match:
        facts["driveos"] = match.group(1)
    tegra = _read("/etc/nv_tegra_release", root)  # "# R38 (release), REVISION: 2.0, ..."
    if tegra:
        match = re.search(r"R(\d+)\s*\(release\).*?REVISION:\s*(\d+)", tegra) or re.search(r"R(\d+)\.(\d+)", tegra)
        facts["l4t"] = f"R{match.group(1)}.{match.group(2)}" if match else None
    model = _read("/proc/device-tree/model", root) or _read("/sys/class/dmi/id/product_name", root)
    facts["model"] = re.sub(r"[_-]+", " ", model) if model else None
    return facts


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path, help="the wheel's _native/variants.json")
    parser.add_argument("--cross", action="store_true", help="a cross build: no target machine to probe")
    parser.add_argument("--sm", type=int, action="append", default=[])
    parser.add_argument("--l4t")
    parser.add_argument("--driveos")
    parser.add_argument("--model")
    args = parser.parse_args(argv)
    variants = json.loads(args.manifest.read_text())["variants"]
    given = bool(args.sm or args.l4t or args.driveos or args.model)
    if args.cross and not given:
        facts = {}
        why_prefix = "cross build"
    elif given:
        facts = {"sms": args.sm, "l4t": args.l4t, "driveos": args.driveos, "model": args.model}
        why_prefix = "given"
    else:
        facts = probe()
        why_prefix = "this machine"
    variant, why = choose(variants, **facts)
    if variant is None:
        print(f"no aarch64 payload of the wheel fits: {why_prefix}: {why}", file=sys.stderr)
        return 3
    print(f"payload {variant} ({why_prefix}: {why}; EDGELLM_BASE_VARIANT names another)", file=sys.stderr)
    print(variant)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
