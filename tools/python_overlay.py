#!/usr/bin/env python3
"""Puts edgellm-allreduce under an installed tensorrt_edgellm package (Edge-LLM's Python package),
so that the package's own loader (tensorrt_edgellm._native.load) loads the overlay.

  python3 tools/python_overlay.py install [--package DIR] [--library FILE]
  python3 tools/python_overlay.py revert  [--package DIR]
  python3 tools/python_overlay.py status  [--package DIR]

DIR is the installed tensorrt_edgellm folder (default: the one `import tensorrt_edgellm` finds);
FILE is our library (default: dist/lib/libNvInfer_edgellm_plugin.so.1.0 of this checkout).

For every payload listed in the package's _native/variants.json, install renames the payload's
lib/libNvInfer_edgellm_plugin.so to lib/libNvInfer_edgellm_plugin_base.so (the overlay's base,
found beside ours) and puts ours under the original name; then it updates plugin_sha256 in
variants.json (the loader checks it) and the wheel's RECORD (so that pip uninstall removes every
file). The original variants.json and RECORD are kept beside them; revert puts every file back
byte for byte. Files are replaced by rename, never rewritten in place. Installing again only
replaces ours (an update); the base stays.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
from pathlib import Path

PLUGIN = "libNvInfer_edgellm_plugin.so"
BASE = "libNvInfer_edgellm_plugin_base.so"
MARKER = "edgellm_allreduce_overlay.json"
ORIGINAL = ".edgellm-allreduce-original"  # suffix of the kept originals


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def replace_with_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Writes a new file and renames it over `path` (a hard link to the old one stays untouched)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def replace_with_copy(path: Path, source: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


class Package:
    def __init__(self, root: Path):
        self.root = root.resolve()
        self.native = self.root / "_native"
        self.manifest = self.native / "variants.json"
        self.marker = self.native / MARKER
        if not self.manifest.is_file():
            sys.exit(f"python_overlay: {self.root} is not a tensorrt_edgellm package with native payloads "
                     f"(no {self.manifest})")
        records = sorted(self.root.parent.glob("tensorrt_edgellm-*.dist-info/RECORD"))
        self.record = records[0] if records else None

    def variants(self) -> list[dict]:
        return json.loads(self.manifest.read_text())["variants"]

    def plugin(self, variant: dict) -> Path:
        return self.root / variant["plugin"]

    def relative(self, path: Path) -> str:
        """A path as the wheel's RECORD writes it (relative to site-packages)."""
        return path.relative_to(self.root.parent).as_posix()

    def installed(self) -> bool:
        return self.marker.is_file()


def keep_original(path: Path) -> Path:
    kept = path.with_name(path.name + ORIGINAL)
    if not kept.exists():
        shutil.copyfile(path, kept)
    return kept


def record_row(pkg: Package, path: Path) -> list[str]:
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [pkg.relative(path), f"sha256={digest}", str(len(data))]


def update_record(pkg: Package, changed: list[Path]) -> None:
    if pkg.record is None:
        return
    rows = list(csv.reader(io.StringIO(keep_original(pkg.record).read_text())))
    wanted = {pkg.relative(p): p for p in changed}
    rows = [r for r in rows if r and r[0] not in wanted]
    rows += [record_row(pkg, p) for p in wanted.values()]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    replace_with_bytes(pkg.record, out.getvalue().encode())


def install(pkg: Package, library: Path) -> None:
    """All or nothing: every payload is checked before anything changes, and a failure while
    changing them (a full disk, a read-only file) puts back what a first install had moved."""
    if not library.is_file():
        sys.exit(f"python_overlay: {library} does not exist: build it first (tools/install.sh)")
    first = not pkg.installed()
    variants = pkg.variants()
    for v in variants:
        plugin = pkg.plugin(v)
        if first and sha256(plugin) != v["plugin_sha256"]:
            sys.exit(f"python_overlay: {plugin} is not the package's own library (SHA-256 differs): nothing touched")
        if not first and not plugin.with_name(BASE).is_file():
            sys.exit(f"python_overlay: {plugin.with_name(BASE)} is missing: revert cannot restore {plugin}; reinstall the package")
    ours = sha256(library)
    changed: list[Path] = []
    moved: list[tuple[Path, Path]] = []
    try:
        for v in variants:
            plugin = pkg.plugin(v)
            base = plugin.with_name(BASE)
            if first:
                os.replace(plugin, base)
                moved.append((base, plugin))
            replace_with_copy(plugin, library)
            changed += [plugin, base]
            print(f"{v['variant_id']}: {pkg.relative(plugin)} is edgellm-allreduce, {BASE} beside it is Edge-LLM's")
        manifest = json.loads(keep_original(pkg.manifest).read_text())
        for v in manifest["variants"]:
            v["plugin_sha256"] = ours
        replace_with_bytes(pkg.manifest, (json.dumps(manifest, indent=2) + "\n").encode())
        replace_with_bytes(pkg.marker, (json.dumps({"library": str(library.resolve()), "sha256": ours}, indent=2) + "\n").encode())
        kept = [pkg.manifest.with_name(pkg.manifest.name + ORIGINAL)]
        if pkg.record is not None:
            kept.append(pkg.record.with_name(pkg.record.name + ORIGINAL))
        update_record(pkg, changed + [pkg.manifest, pkg.marker] + kept)
    except BaseException:
        if first:
            undo_first_install(pkg, moved)
        raise


def undo_first_install(pkg: Package, moved: list[tuple[Path, Path]]) -> None:
    """Puts back what a first install that failed half-way had changed: the libraries, the
    manifest and RECORD (their kept originals), no marker."""
    for base, plugin in moved:
        os.replace(base, plugin)
    for path in (pkg.manifest, pkg.record):
        if path is not None and path.with_name(path.name + ORIGINAL).is_file():
            os.replace(path.with_name(path.name + ORIGINAL), path)
    pkg.marker.unlink(missing_ok=True)
    print(f"python_overlay: install failed; {pkg.root} is as it was", file=sys.stderr)


def revert(pkg: Package) -> None:
    if not pkg.installed():
        sys.exit(f"python_overlay: edgellm-allreduce is not installed in {pkg.root}")
    manifest_original = pkg.manifest.with_name(pkg.manifest.name + ORIGINAL)
    for v in json.loads(manifest_original.read_text())["variants"]:
        plugin = pkg.plugin(v)
        os.replace(plugin.with_name(BASE), plugin)
        if sha256(plugin) != v["plugin_sha256"]:
            print(f"python_overlay: warning: {plugin} does not have the package's SHA-256 after revert", file=sys.stderr)
    os.replace(manifest_original, pkg.manifest)
    if pkg.record is not None:
        os.replace(pkg.record.with_name(pkg.record.name + ORIGINAL), pkg.record)
    pkg.marker.unlink()
    print(f"{pkg.root}: Edge-LLM's own plugin library restored in every payload")


def status(pkg: Package) -> None:
    state = json.loads(pkg.marker.read_text()) if pkg.installed() else None
    for v in pkg.variants():
        plugin = pkg.plugin(v)
        whose = "edgellm-allreduce" if state and sha256(plugin) == state["sha256"] else "Edge-LLM"
        print(f"{v['variant_id']}: {whose}" + (f" (base: {BASE})" if plugin.with_name(BASE).is_file() else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["install", "revert", "status"])
    parser.add_argument("--package", type=Path, help="the installed tensorrt_edgellm folder")
    parser.add_argument("--library", type=Path,
                        default=Path(__file__).resolve().parents[1] / "dist/lib/libNvInfer_edgellm_plugin.so.1.0")
    args = parser.parse_args()
    root = args.package
    if root is None:
        spec = importlib.util.find_spec("tensorrt_edgellm")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("python_overlay: tensorrt_edgellm is not installed here: name it with --package")
        root = Path(list(spec.submodule_search_locations)[0])
    pkg = Package(root)
    {"install": lambda: install(pkg, args.library), "revert": lambda: revert(pkg), "status": lambda: status(pkg)}[
        args.command]()


if __name__ == "__main__":
    main()
