#!/usr/bin/env python3
"""tensorrt-edgellm-build with the fused all-reduce + residual add + RMSNorm (AllReducePlugin fusion_op 1).

Usage: the builder's own command line, run through this file instead of the console script:

    python3 tools/edgellm_build_fused.py --plugin-path /path/to/dist/lib/libNvInfer_edgellm_plugin.so \
        --model-dir CHECKPOINT --engine-dir ENGINES --tp-size 2 --tp-rank 0 [other builder options]

Edge-LLM 0.11's direct builder (`tensorrt-edgellm-build`, `experimental.builder.cli:main`) emits a
plain AllReducePlugin after every row-parallel projection when tp > 1 (`ops/linear.py`
`Linear.forward` -> `ops/functional/distributed.py` `all_reduce` -> `ops/backend.py`
`Net.operation`), adds the residual with `Tensor.__add__` (`ops/tensor.py`) in the decoder layer
(`ops/transformer.py` `DecoderLayer.forward`, `DecoderModel.forward`) and builds RMSNorm from
TensorRT layers in `Net.rmsnorm` (cast, x*x, reduce AVG, + eps, sqrt, div, cast, * weight).
This wrapper installs hooks into those Python functions in this process only (no installed file is
changed), then runs the builder's own `main`:

- `all_reduce(x, tp_size)` with tp_size > 1 returns a pending value instead of adding the plugin.
- `pending + residual` (either order) returns a pending residual sum.
- `Net.rmsnorm` on a pending residual sum adds one AllReducePlugin with `tp_size`, `fusion_op = 1`
  and `eps` (the norm's), inputs (x, residual, gamma) and outputs (normed, residual_out); normed is
  what the norm returns, and residual_out is what the pending sum stands for from then on (the next
  residual add, hidden-state outputs, ...).
- Any other use of a pending value (another op, a LayerNorm, a shape-changing add, reading its
  TensorRT tensor) adds exactly the layers the builder would have added (AllReducePlugin, then the
  SUM) and the all-reduce is reported as left, with the reason.

One line per all-reduce is printed after each engine's network is defined. The fused op needs
edgellm-allreduce's plugin library at build time (--plugin-path, or the wheel's payload after
tools/python_overlay.py) and at run time (EDGELLM_PLUGIN_PATH); with Edge-LLM's own
AllReducePlugin creator loaded (no fusion_op field) the build stops with an error.

Pinned to tensorrt-edgellm 0.11.0: another version, or 0.11.0 files that differ from the release's,
are refused before anything is patched.
"""

import hashlib
import math
import os
import sys
from typing import Callable, List, Optional

EDGELLM_VERSION = "0.11.0"

# SHA-256 of the builder files (under experimental/builder/) whose code the hooks rely on, as
# released in the tensorrt-edgellm 0.11.0 wheel (source revision 74f8732a7e8d).
SOURCE_SHA256 = {
    "ops/tensor.py": "70716a540208252829e21ae5327eb3065a6c753b10d03732d42a3bf6aa3298f4",
    "ops/backend.py": "fb8fd0030e0b0a6d8c1ee1a20416bcfdbc4ed97bb68326a8bbf77580d23e576d",
    "ops/functional/distributed.py": "b9ef650ada1301cb8b62e421a9f11c158dc3f92c718f050dc06e2b5156e466f0",
    "ops/functional/core.py": "78ca3a304fbd632fc3ddb8c81bf34d6a244eac8263668e30008b702be86eb30d",
    "ops/functional/__init__.py": "c7f3477a376bca418e897b16da95710fe5e1c717b7eb054f3cc66ecdbb41e4bb",
    "ops/normalization.py": "97ca8310d5040fac77c29ba13a9690ae54b0a6d5d9da8862cf2edf01b7d84468",
    "ops/linear.py": "bcb9d11bffbc33ceb210978d96bf16e572e31505115297ddd56f01eced2e51c2",
    "ops/transformer.py": "8fa65ba4f731388de6c6f9de3b9a5d4315aa7cd15392addfcf1dd8df7839b319",
    "ops/scope.py": "17737dd87b7cd09c2cdbfc09f34ee1a5176ede133ed5a5cc2822acf7b6ab5dc6",
    "ops/module.py": "426fe1fa794614b824cd5c624beccd66356a005a2bd9bd90d7ff1e856318980e",
    "cli.py": "2279650952dfa5a54f71c7fdbef02cecf87cbf75a9541c5da2d643238dab6413",
    "core/builder.py": "0dca5a12ca492cd8f40d898ea1e64cf2795db199361b81ea5b7b7627df4aa29e",
}

FUSION_FIELDS = ("fusion_op", "eps")
PROG = "edgellm_build_fused"


class Refused(RuntimeError):
    """The installed builder is not the code these hooks were written against."""


class FusionUnavailable(RuntimeError):
    """The AllReducePlugin creator loaded in TensorRT's registry cannot take the fused op."""


def installed_version() -> str:
    from importlib import metadata
    try:
        return metadata.version("tensorrt-edgellm")
    except metadata.PackageNotFoundError:
        from tensorrt_edgellm._version import __version__
        return __version__


def builder_root() -> str:
    import experimental.builder
    return os.path.dirname(os.path.abspath(experimental.builder.__file__))


def check_builder(version: Optional[str] = None, expected: Optional[dict] = None) -> None:
    """Refuse unless the importable builder is tensorrt-edgellm 0.11.0's, file for file."""
    try:
        version = installed_version() if version is None else version
    except ImportError as error:
        raise Refused(f"tensorrt-edgellm is not installed ({error})") from error
    if version != EDGELLM_VERSION:
        raise Refused(f"tensorrt-edgellm {version} is installed; these hooks are written against "
                      f"{EDGELLM_VERSION}'s direct builder only (use tensorrt-edgellm-build as is, "
                      "or the ONNX path with edgellm-allreduce-fuse)")
    try:
        root = builder_root()
    except ImportError as error:
        raise Refused(f"the direct builder (experimental.builder) cannot be imported: {error}") from error
    for relative, digest in (SOURCE_SHA256 if expected is None else expected).items():
        path = os.path.join(root, relative)
        try:
            with open(path, "rb") as f:
                actual = hashlib.sha256(f.read()).hexdigest()
        except OSError as error:
            raise Refused(f"{path}: {error}") from error
        if actual != digest:
            raise Refused(f"{path} is not tensorrt-edgellm {EDGELLM_VERSION}'s (SHA-256 {actual}, "
                          f"released {digest}); refusing to patch changed code")


# --- reporting -------------------------------------------------------------------------------------

_OWN_FILES = {os.path.abspath(__file__)}


def _caller_prefix(*class_names: str) -> str:
    """The checkpoint prefix of the nearest builder module up the stack (a Linear, an RMSNorm)."""
    frame = sys._getframe(1)
    first = None
    while frame is not None:
        owner = frame.f_locals.get("self")
        prefix = getattr(owner, "prefix", None)
        if isinstance(prefix, str):
            name = prefix or type(owner).__name__
            if any(c.__name__ in class_names for c in type(owner).__mro__):
                return name
            first = first or name
        frame = frame.f_back
    return first or "?"


def _first_user() -> str:
    """Where the builder read a pending value: the nearest frame outside these hooks and the
    tensor/lowering plumbing."""
    skip = ("ops/tensor.py", "ops/backend.py", "ops/functional/_operation.py", "ops/functional/core.py")
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path not in _OWN_FILES and not path.replace(os.sep, "/").endswith(skip):
            owner = frame.f_locals.get("self")
            where = f"{os.path.basename(path)}:{frame.f_lineno}"
            name = frame.f_code.co_name
            if owner is not None:
                name = f"{type(owner).__name__}.{name}"
            return f"{name} ({where})"
        frame = frame.f_back
    return "?"


class Entry:
    """One all-reduce the builder asked for."""

    def __init__(self, index: int, linear: str) -> None:
        self.index = index
        self.linear = linear
        self.outcome: Optional[str] = None  # "fused" or "left"
        self.detail = ""

    def line(self) -> str:
        return f"#{self.index} {self.outcome} '{self.linear}': {self.detail}"


class Report:
    """What happened to each all-reduce of one network."""

    def __init__(self) -> None:
        self.entries: List[Entry] = []
        self.notes: List[str] = []

    def new(self, linear: str) -> Entry:
        entry = Entry(len(self.entries) + 1, linear)
        self.entries.append(entry)
        return entry

    def fused(self) -> List[Entry]:
        return [e for e in self.entries if e.outcome == "fused"]

    def lines(self) -> List[str]:
        out = [e.line() if e.outcome else f"#{e.index} never used '{e.linear}' (no layer added)"
               for e in self.entries]
        out.extend(self.notes)
        total = sum(1 for e in self.entries if e.outcome)
        out.append(f"fused {len(self.fused())} of {total} AllReducePlugin all-reduces")
        return out


# --- pending values --------------------------------------------------------------------------------


class Hooks:
    """The installed patches and the report of the network being defined."""

    def __init__(self) -> None:
        import numpy as np
        import tensorrt as trt
        from experimental.builder.core.weights import CheckpointParameter
        from experimental.builder.ops import backend, functional
        from experimental.builder.ops import tensor as tensor_module
        from experimental.builder.ops.functional import distributed
        from experimental.builder.ops.scope import current_net

        self.np, self.trt = np, trt
        self.CheckpointParameter = CheckpointParameter
        self.backend, self.functional, self.distributed = backend, functional, distributed
        self.Tensor = tensor_module.Tensor
        self.current_net = current_net
        self.report = Report()
        self._undo: List[Callable[[], None]] = []
        self._fusion_checked = set()
        self._labels = {}  # id(fused output) -> (tensor, "#n residual_out"), for the report
        self.Pending = self._pending_classes()

    # The pending classes are made here: they subclass the builder's Tensor, so every lowering
    # that unwraps a Tensor (Tensor.unwrap, Net._unwrap -> _as_trt, Tensor methods) reads `_value`,
    # which materializes them; shape and dtype are answered without materializing.
    def _pending_classes(self):
        hooks = self
        Tensor = self.Tensor
        trt = self.trt

        class Pending(Tensor):
            def __init__(self, net, like) -> None:  # no Tensor.__init__: _value is a property here
                self._net = net
                self._like = like  # a tensor of the same shape and type
                self._real = None

            @property
            def _value(self):
                if self._real is None:
                    self._real = self._materialize(f"used by {_first_user()}")
                return self._real

            @property
            def shape(self):
                return self._like.shape

            @property
            def dtype(self):
                return self._like.dtype

        class PendingAllReduce(Pending):
            """allreduce(x), not added to the network yet."""

            def __init__(self, net, x, tp_size: int, entry: Entry) -> None:
                super().__init__(net, hooks._raw(x))
                self.x = x
                self.tp_size = tp_size
                self.entry = entry
                self.absorbed = False  # the all-reduce is inside a fused plugin

            def _materialize(self, reason: str):
                layer = self._net.operation("all_reduce", {"tp_size": self.tp_size}, [self.x])
                if self.absorbed:
                    hooks.report.notes.append(
                        f"note: #{self.entry.index} '{self.entry.linear}' is fused, and its plain sum is "
                        f"also {reason}: a second all-reduce of the same input was added for it")
                elif self.entry.outcome is None:
                    self.entry.outcome, self.entry.detail = "left", f"the all-reduce's output is {reason}"
                return layer.get_output(0)

        class PendingResidualSum(Pending):
            """allreduce(x) + residual (in the builder's operand order), not added yet."""

            def __init__(self, net, lhs, rhs, reduced: PendingAllReduce, residual) -> None:
                super().__init__(net, reduced._like)
                self.lhs, self.rhs = lhs, rhs
                self.reduced = reduced
                self.residual = residual  # raw tensor

            def _materialize(self, reason: str):
                if self.reduced.entry.outcome is None:
                    self.reduced.entry.outcome = "left"
                    self.reduced.entry.detail = f"the residual sum is {reason} (not an RMSNorm)"
                lhs, rhs = hooks._raw(self.lhs), hooks._raw(self.rhs)
                return self._net.elementwise(lhs, rhs, trt.ElementWiseOperation.SUM)

        return {"base": Pending, "all_reduce": PendingAllReduce, "sum": PendingResidualSum}

    def _raw(self, value):
        return value._value if isinstance(value, self.Tensor) else value

    def _unmaterialized(self, value, kind: str) -> bool:
        return isinstance(value, self.Pending[kind]) and value._real is None

    # --- install / uninstall ---

    def _patch(self, owner, name: str, replacement) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> "Hooks":
        hooks = self
        original_all_reduce = self.distributed.all_reduce
        original_add = self.Tensor.__add__
        original_rmsnorm = self.backend.Net.rmsnorm

        def all_reduce(hidden_states, tp_size: int):
            if int(tp_size) <= 1:  # Edge-LLM adds a plugin that copies; nothing to fuse
                return original_all_reduce(hidden_states, tp_size)
            entry = hooks.report.new(_caller_prefix("Linear"))
            return hooks.Pending["all_reduce"](hooks.current_net(), hidden_states, int(tp_size), entry)

        def add(this, other):
            pending = None
            if hooks._unmaterialized(this, "all_reduce"):
                pending, residual = this, other
            elif hooks._unmaterialized(other, "all_reduce"):
                pending, residual = other, this
            if pending is not None:
                raw = hooks._raw(residual)  # a pending residual itself becomes real here
                reason = hooks._why_not_sum(pending, raw)
                if reason is None:
                    return hooks.Pending["sum"](hooks.current_net(), this, other, pending, raw)
                pending.entry.outcome, pending.entry.detail = "left", reason
            return original_add(this, other)

        def rmsnorm(net, x, weight, eps: float, rank: int = 3, weight_before_cast: bool = False):
            if hooks._unmaterialized(x, "sum"):
                normed = hooks._fuse(net, x, weight, eps, rank, weight_before_cast)
                if normed is not None:
                    return normed
            return original_rmsnorm(net, x, weight, eps, rank, weight_before_cast)

        fused_nvfp4 = self.backend.Net.fused_nvfp4_gemm_all_reduce

        def fused_nvfp4_gemm_all_reduce(net, *args, **kwargs):
            entry = hooks.report.new(_caller_prefix("Linear"))
            entry.outcome = "left"
            entry.detail = "FusedNvfp4GemmAllReducePlugin (NVFP4 GEMM + all-reduce, not an AllReducePlugin)"
            return fused_nvfp4(net, *args, **kwargs)

        self._patch(self.distributed, "all_reduce", all_reduce)
        self._patch(self.functional, "all_reduce", all_reduce)
        self._patch(self.Tensor, "__add__", add)
        self._patch(self.backend.Net, "rmsnorm", rmsnorm)
        self._patch(self.backend.Net, "fused_nvfp4_gemm_all_reduce", fused_nvfp4_gemm_all_reduce)
        return self

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> "Hooks":
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    # --- decisions ---

    def _why_not_sum(self, pending, residual) -> Optional[str]:
        trt = self.trt
        if not isinstance(residual, trt.ITensor):
            return f"added to a {type(residual).__name__}, not a tensor"
        x = pending._like
        if tuple(residual.shape) != tuple(x.shape):
            return f"the residual add broadcasts (shape {tuple(residual.shape)} + {tuple(x.shape)})"
        if residual.dtype != x.dtype:
            return f"the residual add mixes {residual.dtype} and {x.dtype}"
        return None

    def _check_creator(self, net) -> None:
        key = id(net)
        if key in self._fusion_checked:
            return
        fields = net.operation_attributes("all_reduce")
        missing = [f for f in FUSION_FIELDS if f not in fields]
        if missing:
            raise FusionUnavailable(
                "the AllReducePlugin creator in TensorRT's registry has no field " + ", ".join(missing) +
                f" (fields: {', '.join(sorted(fields)) or 'none'}): it is Edge-LLM's own plugin, not "
                "edgellm-allreduce's. Pass --plugin-path with edgellm-allreduce's "
                "libNvInfer_edgellm_plugin.so (or install it into the package with tools/python_overlay.py), "
                "or build with plain tensorrt-edgellm-build.")
        self._fusion_checked.add(key)

    def _fuse(self, net, pending_sum, weight, eps, rank, weight_before_cast):
        """Add the fused plugin for `rmsnorm(pending_sum)` and return normed, or None (left, said why)."""
        np, trt = self.np, self.trt
        reduced = pending_sum.reduced
        entry = reduced.entry
        norm = _caller_prefix("RMSNorm")
        x = self._raw(reduced.x)
        residual = pending_sum.residual

        def leave(why: str):
            entry.outcome, entry.detail = "left", f"{why} (norm '{norm}')"
            return None

        if reduced._real is not None:  # already reported: its output has another consumer
            return None
        shape = tuple(x.shape)
        if int(rank) != len(shape):
            return leave(f"the norm's rank {rank} is not the tensor's ({len(shape)}): not over the last axis")
        if x.dtype != trt.float16:
            return leave(f"the all-reduce is {x.dtype}; the builder's RMSNorm returns FP16, the fused op x's type")
        if not (isinstance(eps, (int, float, np.floating)) and math.isfinite(float(eps)) and float(eps) >= 0):
            return leave(f"eps {eps!r} is not a finite number >= 0")
        hidden = int(shape[-1])
        if len(tuple(weight.shape)) != 1 or (hidden >= 0 and int(weight.shape[0]) != hidden):
            return leave(f"the weight's shape {tuple(weight.shape)} is not [{hidden}]")
        self._check_creator(net)

        if isinstance(weight, self.CheckpointParameter):
            value_dtype = np.dtype(weight.value.dtype)
            if value_dtype != np.float16:
                return leave(f"the checkpoint weight is {value_dtype}, not FP16")
            gamma = net.parameter(weight.name, weight.value, "fp16", weight.recipe)
            gamma_name = weight.name
        else:
            array = np.asarray(weight)
            as16 = array.astype(np.float16)
            if not np.array_equal(as16.astype(array.dtype), array):
                return leave(f"the {array.dtype} weight is not exactly FP16")
            gamma = net.const(np.ascontiguousarray(as16.reshape(-1)), "rmsw")
            gamma_name = "constant" + (" (1 + weight)" if weight_before_cast else "")

        layer = net.operation("all_reduce", {"tp_size": reduced.tp_size, "fusion_op": 1, "eps": float(eps)},
                              [x, residual, gamma])
        normed, residual_out = layer.get_output(0), layer.get_output(1)
        pending_sum._real = residual_out
        reduced.absorbed = True
        entry.outcome = "fused"
        self._labels[id(residual_out)] = (residual_out, f"#{entry.index} residual_out")
        residual_label = self._labels.get(id(residual), (None, getattr(residual, "name", "?")))[1]
        entry.detail = (f"into '{norm}' as {layer.name} [fp16, eps={float(eps):g}, gamma={gamma_name}]: "
                        f"x={getattr(x, 'name', '?')}, residual={residual_label} -> normed, residual_out")
        return normed

    def new_network(self) -> Report:
        """Start the report of the next network; returns the finished one."""
        done, self.report = self.report, Report()
        self._labels = {}
        return done


def install() -> Hooks:
    """Check the builder, then patch it in this process. Returns the hooks (`uninstall()` undoes)."""
    check_builder()
    return Hooks().install()


def _print_report(report: Report, label: str, out=None) -> None:
    out = out or sys.stderr
    print(f"{PROG}: {label}", file=out)
    for line in report.lines():
        print(f"  {line}", file=out)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        hooks = install()
    except Refused as error:
        print(f"{PROG}: refused: {error}", file=sys.stderr)
        return 2
    from experimental.builder import cli
    from experimental.builder.core import builder as core_builder

    build_engine = core_builder.build_engine

    def build_engine_reporting(args, *rest, **kwargs):
        hooks.new_network()
        try:
            return build_engine(args, *rest, **kwargs)
        finally:
            _print_report(hooks.new_network(),
                          f"{args.component} engine, tp_size {args.tp_size}, tp_rank {args.tp_rank}")

    hooks._patch(core_builder, "build_engine", build_engine_reporting)
    try:
        cli.main(argv)
    except FusionUnavailable as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    finally:
        hooks.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
