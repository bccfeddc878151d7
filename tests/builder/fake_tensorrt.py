"""A recording stand-in for the parts of TensorRT's Python API that Edge-LLM 0.11's direct builder
touches while it defines a decoder network (`import tensorrt as trt`).

Every `INetworkDefinition.add_*` call becomes a `Layer` in `Network.layers` (kind, inputs, the
attributes the builder sets afterwards); every plugin made through the registry is a `Plugin` with
its decoded fields. Tensors know their shape and type (inferred for the layers the decoder uses),
and `evaluate` runs a network with numpy, so two networks can be compared numerically. The
registry's creators are configurable (`REGISTRY`): by default AllReducePlugin lists
edgellm-allreduce's fields; `use_edgellm_all_reduce_creator()` makes it list Edge-LLM's (tp_size).
"""

import numpy as np

__version__ = "10.16.0"


class _Member:
    def __init__(self, enum: str, name: str) -> None:
        self.enum, self.name = enum, name

    def __repr__(self) -> str:
        return f"{self.enum}.{self.name}"

    def __int__(self) -> int:
        return 0


class _EnumMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        member = _Member(cls.__name__, name)
        setattr(cls, name, member)
        return member


class DataType(metaclass=_EnumMeta):
    pass


float32, float16, bfloat16 = DataType.FLOAT, DataType.HALF, DataType.BF16
int8, int32, int64, uint8, bool = DataType.INT8, DataType.INT32, DataType.INT64, DataType.UINT8, DataType.BOOL
fp8 = DataType.FP8

_NUMPY = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8,
          DataType.INT32: np.int32, DataType.INT64: np.int64, DataType.UINT8: np.uint8, DataType.BOOL: np.bool_}
_FROM_NUMPY = {np.dtype(v): k for k, v in _NUMPY.items()}


class ElementWiseOperation(metaclass=_EnumMeta):
    pass


class ReduceOperation(metaclass=_EnumMeta):
    pass


class UnaryOperation(metaclass=_EnumMeta):
    pass


class ActivationType(metaclass=_EnumMeta):
    pass


class MatrixOperation(metaclass=_EnumMeta):
    pass


class GatherMode(metaclass=_EnumMeta):
    pass


class TensorRTPhase(metaclass=_EnumMeta):
    pass


class PluginFieldType(metaclass=_EnumMeta):
    pass


class NetworkDefinitionCreationFlag(metaclass=_EnumMeta):
    pass


class PreviewFeature(metaclass=_EnumMeta):
    pass


class ProfilingVerbosity(metaclass=_EnumMeta):
    pass


class SampleMode(metaclass=_EnumMeta):
    pass


class ILogger:
    class Severity(metaclass=_EnumMeta):
        pass

    def __init__(self) -> None:
        pass


class Weights:
    def __init__(self, array) -> None:
        self.array = np.asarray(array)


class PluginField:
    def __init__(self, name: str, data=None, type=None) -> None:
        self.name, self.data, self.type = name, data, type


class PluginFieldCollection(list):
    pass


class Plugin:
    """One plugin instance made by a creator: its creator's name and its fields (decoded)."""

    def __init__(self, creator: str, instance: str, fields) -> None:
        self.creator, self.instance = creator, instance
        self.fields = {}
        self.field_types = {}
        for f in fields:
            data = np.asarray(f.data).reshape(-1)
            self.fields[f.name] = data[0].item() if data.size == 1 else data.tolist()
            self.field_types[f.name] = f.type


class Creator:
    def __init__(self, name: str, field_names) -> None:
        self.name = name
        self.field_names = [PluginField(n) for n in field_names]

    def create_plugin(self, name, collection, phase):
        return Plugin(self.name, name, list(collection))


OUR_ALL_REDUCE_FIELDS = ("tp_size", "strategy", "config", "fusion_op", "eps", "has_bias")
REGISTRY = {"AllReducePlugin": OUR_ALL_REDUCE_FIELDS}


def use_edgellm_all_reduce_creator(edgellm: bool = True) -> None:
    REGISTRY["AllReducePlugin"] = ("tp_size", ) if edgellm else OUR_ALL_REDUCE_FIELDS


class _Registry:
    def get_creator(self, name, version, namespace=""):
        return Creator(name, REGISTRY.get(name, ()))


def get_plugin_registry():
    return _Registry()


# --- network -------------------------------------------------------------------------------------


class ITensor:
    def __init__(self, layer, index: int, name: str) -> None:
        self.layer, self.index, self.name = layer, index, name
        self._dtype = None
        self._shape = None

    @property
    def shape(self):  # inferred once the builder asks (it sets shuffle dims after add_shuffle)
        if self._shape is None:
            self._shape = self.layer.output_shape(self.index)
        return self._shape

    @property
    def dtype(self):
        return self._dtype or self.layer.output_dtype(self.index)

    @dtype.setter
    def dtype(self, value) -> None:
        self._dtype = value

    def __repr__(self) -> str:
        return f"ITensor({self.name})"


def _broadcast(a, b):
    if len(a) != len(b):
        raise ValueError(f"elementwise of ranks {len(a)} and {len(b)}")
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif -1 in (x, y):
            out.append(-1)
        else:
            raise ValueError(f"cannot broadcast {a} and {b}")
    return tuple(out)


class Layer:
    def __init__(self, network, kind: str, inputs, params) -> None:
        self.network, self.kind = network, kind
        self.inputs = list(inputs)
        self.params = params
        self.name = f"{kind}_{len(network.layers)}"
        self.reshape_dims = None
        self.second_transpose = None
        self.axis = None
        self.axes = None
        self.num_elementwise_dims = 0
        n = params.get("outputs", 1)
        self._outputs = [ITensor(self, i, f"({self.name})[{i}]") for i in range(n)]

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]

    def set_input(self, index: int, tensor) -> None:
        while len(self.inputs) <= index:
            self.inputs.append(None)
        self.inputs[index] = tensor

    # shape and type inference for what the decoder uses; -1 is a dynamic extent
    def output_shape(self, index: int):
        k, p, i = self.kind, self.params, self.inputs
        if k == "input":
            return tuple(p["shape"])
        if k == "constant":
            return tuple(p["shape"])
        if k == "elementwise":
            return _broadcast(i[0].shape, i[1].shape)
        if k in ("cast", "unary", "activation", "softmax"):
            return i[0].shape
        if k == "reduce":
            reduced = [d for d in range(len(i[0].shape)) if p["axes"] & (1 << d)]
            if p["keep_dims"]:
                return tuple(1 if d in reduced else s for d, s in enumerate(i[0].shape))
            return tuple(s for d, s in enumerate(i[0].shape) if d not in reduced)
        if k == "shuffle":
            shape = i[0].shape
            if len(i) > 1 and i[1] is not None:
                return (-1, ) * max(1, int(i[1].shape[0]))
            if self.reshape_dims is not None:
                shape = tuple(shape[d] if v == 0 else v for d, v in enumerate(self.reshape_dims))
            if self.second_transpose is not None:
                shape = tuple(shape[d] for d in self.second_transpose)
            return tuple(shape)
        if k == "matrix_multiply":
            a, b = list(i[0].shape), list(i[1].shape)
            if p["op0"] is MatrixOperation.TRANSPOSE:
                a[-2:] = a[-1], a[-2]
            if p["op1"] is MatrixOperation.TRANSPOSE:
                b[-2:] = b[-1], b[-2]
            return tuple(_broadcast(tuple(a[:-2]), tuple(b[:-2]))) + (a[-2], b[-1])
        if k == "concatenation":
            axis = self.axis if self.axis is not None else 0
            shapes = [t.shape for t in i]
            total = sum(s[axis] for s in shapes)
            if any(s[axis] < 0 for s in shapes):
                total = -1
            return tuple(total if d == axis else v for d, v in enumerate(shapes[0]))
        if k == "plugin_v3":
            plugin = p["plugin"]
            if plugin.creator == "AttentionPlugin":
                if index == 0:
                    return (i[0].shape[0], plugin.fields["num_q_heads"], plugin.fields["head_size"])
                return i[1].shape
            return i[0].shape
        if k == "shape":
            return (len(i[0].shape), )
        return (-1, )

    def output_dtype(self, index: int):
        k, p, i = self.kind, self.params, self.inputs
        if k == "input":
            return p["dtype"]
        if k == "constant":
            return _FROM_NUMPY[p["array"].dtype]
        if k == "cast":
            return p["dtype"]
        if k == "shape":
            return int64
        if k == "plugin_v3" and p["plugin"].creator == "AttentionPlugin" and index == 1:
            return i[1].dtype
        return i[0].dtype if i else float32


class Network:
    def __init__(self) -> None:
        self.layers = []
        self.outputs = []
        self.inputs = []

    def _add(self, kind, inputs, **params):
        layer = Layer(self, kind, inputs, params)
        self.layers.append(layer)
        return layer

    def add_input(self, name, dtype, shape):
        layer = self._add("input", [], dtype=dtype, shape=tuple(shape))
        layer.get_output(0).name = name
        self.inputs.append(layer.get_output(0))
        return layer.get_output(0)

    def add_constant(self, shape, weights):
        return self._add("constant", [], shape=tuple(shape), array=np.asarray(weights.array).reshape(shape))

    def add_elementwise(self, a, b, op):
        return self._add("elementwise", [a, b], op=op)

    def add_cast(self, x, dtype):
        return self._add("cast", [x], dtype=dtype)

    def add_reduce(self, x, op, axes, keep_dims):
        return self._add("reduce", [x], op=op, axes=axes, keep_dims=keep_dims)

    def add_unary(self, x, op):
        return self._add("unary", [x], op=op)

    def add_activation(self, x, act):
        return self._add("activation", [x], act=act)

    def add_shuffle(self, x):
        return self._add("shuffle", [x])

    def add_softmax(self, x):
        return self._add("softmax", [x])

    def add_shape(self, x):
        return self._add("shape", [x])

    def add_matrix_multiply(self, a, op0, b, op1):
        return self._add("matrix_multiply", [a, b], op0=op0, op1=op1)

    def add_concatenation(self, tensors):
        return self._add("concatenation", list(tensors))

    def add_plugin_v3(self, inputs, shape_inputs, plugin):
        outputs = 2 if plugin.creator == "AttentionPlugin" or plugin.fields.get("fusion_op") == 1 else 1
        return self._add("plugin_v3", list(inputs), plugin=plugin, outputs=outputs)

    def __getattr__(self, name):
        if name.startswith("add_"):  # anything else the builder adds: recorded, not inferred
            return lambda *args, **kwargs: self._add(name[4:], [a for a in args if isinstance(a, ITensor)],
                                                     args=args, kwargs=kwargs)
        raise AttributeError(name)

    def mark_output(self, tensor) -> None:
        self.outputs.append(tensor)

    # --- queries for tests ---
    def plugins(self, creator=None):
        return [l for l in self.layers if l.kind == "plugin_v3" and creator in (None, l.params["plugin"].creator)]

    def consumers(self, tensor):
        return [(l, n) for l in self.layers for n, t in enumerate(l.inputs) if t is tensor]

    def producer_chain(self, tensor):
        """Every layer `tensor` depends on (itself included), in definition order."""
        seen, stack = set(), [tensor.layer]
        while stack:
            layer = stack.pop()
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            stack.extend(t.layer for t in layer.inputs if t is not None)
        return [l for l in self.layers if id(l) in seen]


class Builder:
    def __init__(self, logger=None) -> None:
        self.logger = logger

    def create_network(self, flags=0):
        return Network()


# --- numpy evaluation ----------------------------------------------------------------------------

_UNARY = {"SQRT": np.sqrt, "EXP": np.exp, "RECIP": lambda x: 1 / x, "ABS": np.abs, "NEG": np.negative,
          "COS": np.cos, "SIN": np.sin}
_ELEMENTWISE = {"SUM": np.add, "PROD": np.multiply, "DIV": np.divide, "SUB": np.subtract,
                "MAX": np.maximum, "MIN": np.minimum, "POW": np.power}


def evaluate(network, feeds, wanted, tp_size: int):
    """Values of `wanted` tensors given `feeds` {input name: array}. Every rank's partial sum is
    taken to equal this rank's, so an all-reduce multiplies by tp_size. AttentionPlugin returns
    the query part of its packed input (no attention), the fused AllReducePlugin computes
    edgellm-allreduce's fused op (fp32 inside, rounded once)."""
    values = {}

    def value(t):
        if id(t) not in values:
            run(t.layer)
        return values[id(t)]

    def run(layer):
        k, p = layer.kind, layer.params
        attention = k == "plugin_v3" and p["plugin"].creator == "AttentionPlugin"
        args = [value(t) for t in (layer.inputs[:2] if attention else layer.inputs)]
        out = None
        if k == "input":
            out = [np.asarray(feeds[layer.get_output(0).name], dtype=_NUMPY[p["dtype"]])]
        elif k == "constant":
            out = [p["array"]]
        elif k == "elementwise":
            r = _ELEMENTWISE[p["op"].name](args[0], args[1])
            out = [r.astype(np.result_type(args[0].dtype, args[1].dtype))]
        elif k == "cast":
            out = [args[0].astype(_NUMPY[p["dtype"]])]
        elif k == "reduce" and p["op"].name == "AVG":
            axes = tuple(d for d in range(args[0].ndim) if p["axes"] & (1 << d))
            out = [args[0].mean(axis=axes, keepdims=p["keep_dims"]).astype(args[0].dtype)]
        elif k == "unary":
            out = [_UNARY[p["op"].name](args[0]).astype(args[0].dtype)]
        elif k == "activation" and p["act"].name == "SIGMOID":
            x = args[0].astype(np.float32)
            out = [(1 / (1 + np.exp(-x))).astype(args[0].dtype)]
        elif k == "shuffle" and len(args) == 1:
            x = args[0]
            if layer.reshape_dims is not None:
                x = x.reshape([x.shape[d] if v == 0 else v for d, v in enumerate(layer.reshape_dims)])
            if layer.second_transpose is not None:
                x = x.transpose(layer.second_transpose)
            out = [x]
        elif k == "matrix_multiply":
            a, b = args
            if p["op0"] is MatrixOperation.TRANSPOSE:
                a = np.swapaxes(a, -1, -2)
            if p["op1"] is MatrixOperation.TRANSPOSE:
                b = np.swapaxes(b, -1, -2)
            out = [np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)]
        elif k == "concatenation":
            out = [np.concatenate(args, axis=layer.axis or 0)]
        elif k == "plugin_v3":
            plugin = p["plugin"]
            if plugin.creator == "AttentionPlugin":
                q, hd = plugin.fields["num_q_heads"], plugin.fields["head_size"]
                qkv = args[0]
                out = [qkv[:, :q * hd].reshape(qkv.shape[0], q, hd), args[1]]
            elif plugin.creator == "AllReducePlugin" and plugin.fields.get("fusion_op", 0) == 0:
                out = [(args[0].astype(np.float32) * tp_size).astype(args[0].dtype)]
            elif plugin.creator == "AllReducePlugin":
                x, residual, gamma = (a.astype(np.float32) for a in args[:3])
                r32 = x * tp_size + residual
                r = r32.astype(args[0].dtype)
                r32 = r.astype(np.float32)
                scale = 1 / np.sqrt((r32 * r32).mean(axis=-1, keepdims=True) + np.float32(plugin.fields["eps"]))
                out = [(r32 * scale * gamma).astype(args[0].dtype), r]
        if out is None:
            raise NotImplementedError(f"evaluate: {layer.name} ({k}, {p})")
        for t, v in zip(layer._outputs, out):
            values[id(t)] = v

    return [value(t) for t in wanted]

