#!/usr/bin/env python3
"""tools/edgellm_variant.py: which aarch64 payload of the tensorrt-edgellm 0.11.0 wheel each machine
gets as the overlay's base, over fake machines (GPUs, L4T / DRIVE OS releases, device models, and
probes of a fake file system). The manifest is the wheel's own, trimmed (aarch64_variants.json).
Usage: variant_test.py [TOOL] (default: tools/edgellm_variant.py of this checkout)."""

import importlib.util
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

here = Path(__file__).resolve().parent
tool = Path(sys.argv[1]) if len(sys.argv) > 1 else here.parents[1] / "tools/edgellm_variant.py"
spec = importlib.util.spec_from_file_location("edgellm_variant", tool)
variant = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variant)
manifest = here / "aarch64_variants.json"
rows = json.loads(manifest.read_text())["variants"]
failures = 0


def check(got, expected, what):
    global failures
    ok = got == expected
    failures += not ok
    print(("ok   " if ok else "FAIL ") + f"{what}: {got!r}" + ("" if ok else f", expected {expected!r}"))


def choose(**facts):
    return variant.choose(rows, **facts)[0]


# The GPU alone (nvidia-smi, no release marker found).
check(choose(sms=[121]), "dgx-spark-cu13-sm121", "sm_121 -> DGX Spark")
check(choose(sms=[110]), "jetson-thor-jp72-cu13-sm110", "sm_110 alone -> Jetson Thor, newest JetPack")
check(choose(sms=[87]), "jetson-orin-jp72-cu13-sm87", "sm_87 alone -> Jetson Orin")
check(choose(sms=[120]), "igx-thor-cu13-sm110-sm120", "sm_120 on aarch64 -> IGX Thor's dGPU payload")
check(choose(sms=[90]), None, "sm_90 (GH200) -> none")
check(choose(sms=[100, 100]), None, "sm_100 (GB200) -> none")
# Jetson: the L4T release picks the JetPack.
check(choose(sms=[110], l4t="R38.2"), "jetson-thor-jp70-cu13-sm110", "sm_110 + L4T R38.2 -> Thor JetPack 7.0")
check(choose(sms=[110], l4t="R38.4"), "jetson-thor-jp71-cu13-sm110", "sm_110 + L4T R38.4 -> Thor JetPack 7.1")
check(choose(sms=[110], l4t="R38.3"), "jetson-thor-jp70-cu13-sm110", "sm_110 + L4T R38.3 -> the newest r38 not newer")
check(choose(sms=[110], l4t="R38.9"), "jetson-thor-jp71-cu13-sm110", "sm_110 + L4T R38.9 -> JetPack 7.1")
check(choose(sms=[110], l4t="R39.2"), "jetson-thor-jp72-cu13-sm110", "sm_110 + L4T R39.2 -> Thor JetPack 7.2")
check(choose(sms=[110], l4t="R38.0"), None, "sm_110 + L4T R38.0 (older than every payload) -> none")
check(choose(sms=[87], l4t="R39.2"), "jetson-orin-jp72-cu13-sm87", "sm_87 + L4T R39.2 -> Orin JetPack 7.2")
check(choose(sms=[87], l4t="R36.4"), None, "sm_87 + L4T R36.4 (JetPack 6, CUDA 12) -> none")
check(choose(l4t="R38.2", model="NVIDIA Jetson AGX Thor Developer Kit"), "jetson-thor-jp70-cu13-sm110",
      "L4T R38.2, no nvidia-smi, Thor model -> Thor JetPack 7.0")
check(choose(l4t="R39.2", model="NVIDIA Jetson AGX Orin Developer Kit"), "jetson-orin-jp72-cu13-sm87",
      "L4T R39.2, no nvidia-smi, Orin model -> Orin")
check(choose(l4t="R39.2"), None, "L4T without a GPU or model -> none")
# Device models and DRIVE OS come first, as in Edge-LLM's loader.
check(choose(sms=[110, 120], model="NVIDIA IGX Thor Developer Kit"), "igx-thor-cu13-sm110-sm120",
      "IGX Thor (sm_110 + sm_120) -> IGX Thor")
check(choose(sms=[110], l4t="R38.2", model="NVIDIA IGX Thor"), "igx-thor-cu13-sm110-sm120",
      "IGX Thor with an L4T release -> IGX Thor")
check(choose(model="NVIDIA DGX Spark"), "dgx-spark-cu13-sm121", "DGX Spark model, no nvidia-smi -> Spark")
check(choose(sms=[121], model="NVIDIA GB10"), "dgx-spark-cu13-sm121", "GB10 -> Spark")
check(choose(sms=[110], driveos="7.2"), "drive-thor-d72-cu13-sm110", "DRIVE OS 7.2 -> DRIVE Thor")
check(choose(driveos="7.3"), "drive-thor-d72-cu13-sm110", "DRIVE OS 7.3 -> the newest not newer")
check(choose(driveos="6.0"), None, "DRIVE OS 6.0 -> none")
# Nothing to go by: the documented default.
check(choose(), "dgx-spark-cu13-sm121", "no facts (a build machine) -> the default, DGX Spark")
check(variant.DEFAULT, "dgx-spark-cu13-sm121", "the default")
check(variant.choose([r for r in rows if r["cpu_arch"] != "aarch64"], sms=[121])[0], None, "no aarch64 rows -> none")

# probe() on fake machines: files under a root, nvidia-smi's answer.
def smi(text):
    def run(*args, **kwargs):
        if text is None:
            raise FileNotFoundError("nvidia-smi")
        return types.SimpleNamespace(stdout=text, returncode=0)
    return run


def machine(files, smi_text):
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            (Path(root) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(root) / path).write_text(text)
        facts = variant.probe(Path(root), smi(smi_text))
    return facts, variant.choose(rows, **facts)[0]


tegra = "# R38 (release), REVISION: 4.0, GCID: 41466389, BOARD: generic, EABI: aarch64, DATE: Mon Sep 15 2025\n"
facts, got = machine({"etc/nv_tegra_release": tegra, "proc/device-tree/model": "NVIDIA Jetson AGX Thor Developer Kit\0"},
                     "11.0\n")
check((facts["l4t"], facts["sms"], got), ("R38.4", [110], "jetson-thor-jp71-cu13-sm110"), "probe: Jetson Thor, L4T R38.4")
facts, got = machine({"etc/nv_tegra_release": "# R39 (release), REVISION: 2.1, BOARD: generic\n",
                      "proc/device-tree/model": "NVIDIA Jetson AGX Orin\0"}, None)
check((facts["l4t"], facts["sms"], got), ("R39.2", [], "jetson-orin-jp72-cu13-sm87"), "probe: Orin without nvidia-smi")
facts, got = machine({"sys/class/dmi/id/product_name": "NVIDIA_DGX_Spark\n"}, "12.1\n")
check((facts["model"], got), ("NVIDIA DGX Spark", "dgx-spark-cu13-sm121"), "probe: DGX Spark (DMI name)")
facts, got = machine({"etc/driveos-release": 'VERSION_ID="7.2.0"\n'}, "11.0\n")
check((facts["driveos"], got), ("7.2", "drive-thor-d72-cu13-sm110"), "probe: DRIVE OS")
facts, got = machine({}, "9.0\n9.0\n")
check((facts["sms"], got), ([90, 90], None), "probe: GH200 -> none")
facts, got = machine({}, None)
check(got, "dgx-spark-cu13-sm121", "probe: nothing (no GPU, no markers) -> the default")

# The command line, as tools/edgellm_base.sh runs it.
def cli(*args):
    done = subprocess.run([sys.executable, str(tool), str(manifest), *args], capture_output=True, text=True)
    return done.returncode, done.stdout.strip(), done.stderr.strip()


rc, out, err = cli("--cross")
check((rc, out), (0, "dgx-spark-cu13-sm121"), "--cross: the default")
check("cross build" in err and "EDGELLM_BASE_VARIANT" in err, True, f"--cross says why: {err}")
check(cli("--sm", "110", "--l4t", "R38.2")[:2], (0, "jetson-thor-jp70-cu13-sm110"), "--sm 110 --l4t R38.2")
check(cli("--sm", "90")[0], 3, "--sm 90: exit 3")

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
