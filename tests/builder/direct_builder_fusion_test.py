#!/usr/bin/env python3
"""tools/edgellm_build_fused.py on Edge-LLM 0.11's own direct-builder code, without TensorRT.

The Python sources of the tensorrt-edgellm 0.11.0 wheel are extracted under --work (no shared
objects, nothing installed); `tensorrt` is tests/builder/fake_tensorrt.py, which records every
network-definition call and plugin creation and can evaluate a network with numpy. The builder's
real modules define the networks: Qwen3Model (DecoderModel, Qwen3DecoderLayer, Qwen3Attention,
GatedMLP, RMSNorm, Linear, Net and its lowerings), with a 2-layer config and random FP16 weights
from a stand-in for the checkpoint reader (core.weights.Weights reads safetensors files; the
stand-in returns the same LinearWeights / CheckpointParameter records and uses the real
Weights.shard_linear). Each case builds the network with and without the hooks and checks the
plugins, their fields and wiring, the report, and that both networks compute the same thing.
numpy is the only dependency (installed with pip under --work when missing; exit 77 if it cannot be).
No torch: the direct builder does not import it.
"""

import argparse
import contextlib
import importlib.util
import io
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
FAILURES = []


def check(condition, what: str) -> None:
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        FAILURES.append(what)


def extract(wheel: Path, site: Path) -> None:
    marker = site / ".extracted"
    if marker.exists() and marker.read_text() == str(wheel):
        return
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py") and name.startswith(("experimental/", "tensorrt_edgellm/")) or (
                    ".dist-info/" in name and name.endswith(("METADATA", "RECORD", "entry_points.txt"))):
                archive.extract(name, site)
    marker.write_text(str(wheel))


def ensure_numpy(work: Path) -> None:
    if importlib.util.find_spec("numpy") is not None:
        return
    deps = work / "deps"
    sys.path.insert(0, str(deps))
    if not (deps / "numpy").exists():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(deps),
                               "numpy>=2.2.6,<3"], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"skipped: numpy is missing and pip could not install it:\n{done.stderr}")
            sys.exit(77)


# --- the model ------------------------------------------------------------------------------------

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, LAYERS, EPS = 16, 4, 2, 4, 32, 2, 1e-6


class Cfg(SimpleNamespace):
    def attention_type(self, index):
        return "full_attention"


def config(tp_size, tp_rank):
    # Per-rank head and MLP counts, as core.config.load_device_config divides them.
    return Cfg(num_hidden_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS // tp_size,
               num_key_value_heads=KV_HEADS // tp_size, head_dim=HEAD_DIM, intermediate_size=INTERMEDIATE // tp_size,
               rms_norm_eps=EPS, hidden_act="silu", sliding_window_size=-1, kv_cache_quant=None,
               skip_softmax_scale_factor=0.0, tp_size=tp_size, tp_rank=tp_rank, tie_word_embeddings=False,
               rotary_dim=HEAD_DIM, engine_role="base")


def checkpoint(np, norm_biases=()):
    rng = np.random.default_rng(30)
    t = {}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for name, shape in (("self_attn.q_proj", (HEADS * HEAD_DIM, HIDDEN)),
                            ("self_attn.k_proj", (KV_HEADS * HEAD_DIM, HIDDEN)),
                            ("self_attn.v_proj", (KV_HEADS * HEAD_DIM, HIDDEN)),
                            ("self_attn.o_proj", (HIDDEN, HEADS * HEAD_DIM)),
                            ("mlp.gate_proj", (INTERMEDIATE, HIDDEN)), ("mlp.up_proj", (INTERMEDIATE, HIDDEN)),
                            ("mlp.down_proj", (HIDDEN, INTERMEDIATE))):
            t[f"{p}.{name}.weight"] = (rng.standard_normal(shape) * 0.25).astype(np.float16)
        for name in ("self_attn.q_norm", "self_attn.k_norm"):
            t[f"{p}.{name}.weight"] = (1 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float16)
        for name in ("input_layernorm", "post_attention_layernorm"):
            t[f"{p}.{name}.weight"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float16)
    t["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float16)
    for prefix in norm_biases:
        t[prefix + ".bias"] = (0.1 * rng.standard_normal(HIDDEN)).astype(np.float16)
    return t


def standin_weights(builder, np, tensors, externalize):
    """The checkpoint reader's interface as the decoder modules use it, over a dict of arrays."""
    quantization = builder["quantization"]
    W = builder["weights"]

    class StandInWeights:
        shard_linear = staticmethod(W.Weights.shard_linear)

        def has(self, name):
            return name in tensors

        def module_quant_type(self, prefix, *, tie_word_embeddings=False):
            return quantization.QUANT_FP16

        def is_nvfp4(self, prefix):
            return False

        def linear_adapter(self, prefix):
            return None

        def linear_descriptor(self, prefix, quant_type, *, external_kind=""):
            return W.LinearWeights(quant_type=quantization.QUANT_FP16, weight=tensors[prefix + ".weight"])

        def linear(self, prefix, quant_type):
            return self.linear_descriptor(prefix, quant_type)

        def fp16_parameter(self, name):
            value = tensors[name]
            if externalize:
                value = W.ParameterSpec(value.shape, np.float16)
            return W.CheckpointParameter(name, value, {"checkpoint_keys": [name]})

        def f16(self, name):
            return tensors[name].astype(np.float16)

        def qkv_scales(self, prefix):
            return (1.0, 1.0, 1.0)

    return StandInWeights()


def import_builder():
    import experimental.builder.core.quantization as quantization
    import experimental.builder.core.weight_policy as weight_policy
    import experimental.builder.core.weights as weights
    import experimental.builder.ops as ops
    import experimental.builder.ops.backend as backend
    import experimental.builder.ops.scope as scope
    from experimental.builder.models.qwen3 import modeling_qwen3
    return {"quantization": quantization, "weight_policy": weight_policy, "weights": weights, "ops": ops,
            "backend": backend, "scope": scope, "qwen3": modeling_qwen3}


def define(builder, tool, *, tp_size=2, tp_rank=0, hooked=True, externalize=True, model=None,
           deepstack=False, norm_biases=()):
    """Define the decoder network with the builder's own modules; returns what the test reads."""
    import numpy as np
    import tensorrt as trt
    ops, backend = builder["ops"], builder["backend"]
    tensors = checkpoint(np, norm_biases)
    policy = builder["weight_policy"].WeightPolicy(kinds=("fp16", ) if externalize else ())
    network = trt.Builder().create_network()
    net = backend.Net(trt.Builder(), network, policy=policy)
    ctx = ops.BuildContext(net=net, cfg=config(tp_size, tp_rank), weights=standin_weights(builder, np, tensors, externalize),
                           options=ops.BuildOptions(), bundle=None, args=None)
    hooks = tool.Hooks().install() if hooked else None
    try:
        decoder = (model or builder["qwen3"].Qwen3Model)(ctx)
        with builder["scope"].build_scope(ctx):
            add = lambda name, dtype, shape: ops.Tensor(net.add_input(name, dtype, shape))  # noqa: E731
            embeds = add("inputs_embeds", trt.float16, (-1, HIDDEN))
            pasts = [add(f"past_key_values_{i}", trt.float16, (2, -1, 128, KV_HEADS // tp_size, HEAD_DIM))
                     for i in range(LAYERS)]
            rope = add("rope_rotary_cos_sin", trt.float32, (-1, HEAD_DIM))
            ragged = ops.add_ragged_decoder_inputs(add)
            extra = {"deepstack_embeds": [add("deepstack_0", trt.float16, (-1, HIDDEN))]} if deepstack else {}
            hidden, presents, all_hidden = decoder(embeds, pasts, rope, ragged, **extra)
            net.mark_output(hidden, "hidden_states")
            for i, h in enumerate(all_hidden):
                net.mark_output(h, f"layer_{i}")
    finally:
        report = hooks.new_network() if hooks else None
        if hooks:
            hooks.uninstall()
    return SimpleNamespace(network=network, tensors=tensors, report=report, outputs=list(network.outputs))


def feeds(run, np, tokens=3, seed=7):
    rng = np.random.default_rng(seed)
    values = {"inputs_embeds": rng.standard_normal((tokens, HIDDEN)).astype(np.float16)}
    if any(t.name == "deepstack_0" for t in run.network.inputs):
        values["deepstack_0"] = rng.standard_normal((tokens, HIDDEN)).astype(np.float16)
    for t in run.network.inputs:
        if t.name in run.tensors:
            values[t.name] = run.tensors[t.name]
        elif t.name.startswith("past_key_values"):
            values[t.name] = np.zeros((2, 1, 128, KV_HEADS, HEAD_DIM), np.float16)
    return values


def same_numbers(fake, np, a, b, tp_size, label):
    """Both networks' outputs on the same inputs (every rank's partials taken equal)."""
    va = fake.evaluate(a.network, feeds(a, np), a.outputs, tp_size)
    vb = fake.evaluate(b.network, feeds(b, np), b.outputs, tp_size)
    # Differences are fp16 roundings: the builder rounds the normalized value and the product,
    # the fused op rounds once (docs/FUSION.md, "Numerics"); compared against each output's
    # largest value.
    worst = max(float(np.max(np.abs(x.astype(np.float32) - y.astype(np.float32))) /
                      np.max(np.abs(y.astype(np.float32)))) for x, y in zip(va, vb))
    check([t.name for t in a.outputs] == [t.name for t in b.outputs] and worst < 5e-3,
          f"{label}: the hooked network computes the builder's ({len(va)} outputs, largest difference "
          f"{worst:.1e} of the output's range)")


def fused_plugins(network):
    return [l for l in network.plugins("AllReducePlugin") if l.params["plugin"].fields.get("fusion_op") == 1]


def plain_plugins(network):
    return [l for l in network.plugins("AllReducePlugin") if "fusion_op" not in l.params["plugin"].fields]


def rmsnorm_chains(network):
    return [l for l in network.layers if l.kind == "reduce" and l.params["op"].name == "AVG"]


# --- cases ----------------------------------------------------------------------------------------


def case_qwen3_tp2(builder, tool, fake, np, externalize):
    label = f"Qwen3 tp 2 ({'external' if externalize else 'constant'} norm weights)"
    plain = define(builder, tool, hooked=False, externalize=externalize)
    run = define(builder, tool, externalize=externalize)
    n = run.network
    check(len(plain_plugins(plain.network)) == 4 and len(rmsnorm_chains(plain.network)) == 5,
          f"{label}: unhooked, the builder adds 4 AllReducePlugin and 5 decomposed RMSNorms")
    fused = fused_plugins(n)
    check(len(fused) == 4 and not plain_plugins(n), f"{label}: hooked, 4 fused AllReducePlugin and no plain one")
    check(len(rmsnorm_chains(n)) == 1, f"{label}: one decomposed RMSNorm left (layer 0's input_layernorm)")
    ok_fields = all(l.params["plugin"].fields.keys() == {"tp_size", "fusion_op", "eps"}
                    and l.params["plugin"].fields["tp_size"] == 2 and l.params["plugin"].fields["fusion_op"] == 1
                    and abs(l.params["plugin"].fields["eps"] - EPS) < 1e-12
                    and l.params["plugin"].field_types["eps"] is fake.PluginFieldType.FLOAT32
                    and l.params["plugin"].field_types["tp_size"] is fake.PluginFieldType.INT32
                    and l.params["plugin"].field_types["fusion_op"] is fake.PluginFieldType.INT32
                    and l.num_outputs == 2 for l in fused)
    check(ok_fields, f"{label}: fields tp_size=2 (INT32), fusion_op=1 (INT32), eps=1e-6 (FLOAT32); 2 outputs")

    norms = ["model.layers.0.post_attention_layernorm", "model.layers.1.input_layernorm",
             "model.layers.1.post_attention_layernorm", "model.norm"]
    linears = ["model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj",
               "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.down_proj"]
    embeds = next(t for t in n.inputs if t.name == "inputs_embeds")
    residual_expected = [embeds] + [l.get_output(1) for l in fused[:3]]
    for k, layer in enumerate(fused):
        x, residual, gamma = layer.inputs
        shard = np.split(run.tensors[linears[k] + ".weight"], 2, axis=1)[0]
        x_ok = (x.layer.kind == "matrix_multiply" and x.layer.inputs[1].layer.kind == "constant"
                and np.array_equal(x.layer.inputs[1].layer.params["array"], shard))
        if externalize:
            gamma_ok = gamma.layer.kind == "input" and gamma.name == norms[k] + ".weight" and gamma.shape == (HIDDEN, )
        else:
            gamma_ok = gamma.layer.kind == "constant" and np.array_equal(gamma.layer.params["array"],
                                                                         run.tensors[norms[k] + ".weight"])
        check(x_ok and residual is residual_expected[k] and gamma_ok and gamma.dtype is fake.float16,
              f"{label}: #{k + 1} x = {linears[k]} rank 0 shard's matmul, residual = "
              f"{'inputs_embeds' if k == 0 else f'#{k} residual_out'}, gamma = {norms[k]}.weight (FP16, [16])")
    # normed feeds the next projections; residual_out the next residual and the hidden-state outputs
    consumers = [sorted(c.kind for c, _ in n.consumers(l.get_output(0))) for l in fused]
    check(consumers[0] == ["matrix_multiply"] * 2 and consumers[1] == ["matrix_multiply"] * 3
          and consumers[2] == ["matrix_multiply"] * 2 and consumers[3] == [],
          f"{label}: normed feeds gate/up, q/k/v, gate/up; the last is the model's output")
    outputs = {t.name: t for t in run.outputs}
    check(outputs["hidden_states"] is fused[3].get_output(0) and outputs["layer_0"] is fused[1].get_output(1)
          and outputs["layer_1"] is fused[3].get_output(1),
          f"{label}: hidden_states = #4 normed; layer_0 / layer_1 hidden states = #2 / #4 residual_out")
    lines = run.report.lines()
    check(len(lines) == 5 and all(f"#{k + 1} fused '{linears[k]}': into '{norms[k]}'" in lines[k] for k in range(4))
          and "residual=inputs_embeds" in lines[0] and "residual=#3 residual_out" in lines[3]
          and lines[-1] == "fused 4 of 4 AllReducePlugin all-reduces",
          f"{label}: the report names each projection and its norm:\n      " + "\n      ".join(lines))
    same_numbers(fake, np, run, plain, 2, label)


def case_rank1(builder, tool, fake, np):
    run = define(builder, tool, tp_rank=1)
    fused = fused_plugins(run.network)
    shard = np.split(run.tensors["model.layers.0.self_attn.o_proj.weight"], 2, axis=1)[1]
    x = fused[0].inputs[0]
    check(len(fused) == 4 and np.array_equal(x.layer.inputs[1].layer.params["array"], shard),
          "tp rank 1: 4 fused, x is rank 1's o_proj shard")


def case_tp1(builder, tool, fake, np):
    plain = define(builder, tool, tp_size=1, hooked=False)
    run = define(builder, tool, tp_size=1)

    def signature(network):
        return [(l.kind, tuple(sorted(k for k in l.params if k not in ("array", "plugin")))) for l in network.layers]

    check(signature(run.network) == signature(plain.network) and not run.network.plugins("AllReducePlugin"),
          "tp 1: no all-reduce, the hooked network is the builder's layer for layer")
    check(run.report.lines() == ["fused 0 of 0 AllReducePlugin all-reduces"], "tp 1: the report says nothing was fused")


def case_deepstack(builder, tool, fake, np):
    plain = define(builder, tool, hooked=False, deepstack=True)
    run = define(builder, tool, deepstack=True)
    lines = run.report.lines()
    check(len(fused_plugins(run.network)) == 3 and len(plain_plugins(run.network)) == 1,
          "deepstack add after layer 0: 3 fused, layer 0's MLP all-reduce left plain")
    check(lines[1].startswith("#2 left 'model.layers.0.mlp.down_proj': the residual sum is used by "
                              "Qwen3Model.forward (transformer.py:"),
          f"deepstack: reported as left, naming the use: {lines[1]}")
    same_numbers(fake, np, run, plain, 2, "deepstack")


def case_layernorm(builder, tool, fake, np):
    ops, qwen3 = builder["ops"], builder["qwen3"]

    class LayerNormDecoderLayer(qwen3.Qwen3DecoderLayer):
        norm_class = ops.LayerNorm

    class LayerNormModel(ops.DecoderModel):
        layer_class = LayerNormDecoderLayer
        norm_class = ops.LayerNorm

    biases = [f"model.layers.{i}.{n}" for i in range(LAYERS) for n in ("input_layernorm", "post_attention_layernorm")]
    biases.append("model.norm")
    plain = define(builder, tool, hooked=False, model=LayerNormModel, norm_biases=biases)
    run = define(builder, tool, model=LayerNormModel, norm_biases=biases)
    lines = run.report.lines()
    check(not fused_plugins(run.network) and len(plain_plugins(run.network)) == 4
          and all("used by LayerNorm.forward (normalization.py:" in line for line in lines[:4])
          and lines[-1] == "fused 0 of 4 AllReducePlugin all-reduces",
          "LayerNorm (with bias) after every all-reduce: all 4 left, each reported:\n      " + "\n      ".join(lines))
    same_numbers(fake, np, run, plain, 2, "LayerNorm")

    class FinalLayerNormModel(qwen3.Qwen3Model):
        norm_class = ops.LayerNorm

    plain = define(builder, tool, hooked=False, model=FinalLayerNormModel, norm_biases=["model.norm"])
    run = define(builder, tool, model=FinalLayerNormModel, norm_biases=["model.norm"])
    lines = run.report.lines()
    check(len(fused_plugins(run.network)) == 3 and len(plain_plugins(run.network)) == 1
          and lines[3].startswith("#4 left 'model.layers.1.mlp.down_proj': the residual sum is used by LayerNorm.forward")
          and lines[-1] == "fused 3 of 4 AllReducePlugin all-reduces",
          f"final norm a LayerNorm: the last MLP all-reduce left ({lines[3]})")
    same_numbers(fake, np, run, plain, 2, "final LayerNorm")


def case_unit_offset(builder, tool, fake, np):
    """Qwen3.5-style RMSNorm(weight + 1), computed by the builder with the weight before the cast."""
    ops, qwen3 = builder["ops"], builder["qwen3"]

    class UnitOffsetRMSNorm(ops.RMSNorm):
        def __init__(self, ctx, prefix, eps=None, rank=None):
            super().__init__(ctx, prefix, eps, rank, unit_offset=True)

    class UnitOffsetLayer(qwen3.Qwen3DecoderLayer):
        norm_class = UnitOffsetRMSNorm

    class UnitOffsetModel(qwen3.Qwen3Model):
        layer_class = UnitOffsetLayer
        norm_class = UnitOffsetRMSNorm

    plain = define(builder, tool, hooked=False, model=UnitOffsetModel)
    run = define(builder, tool, model=UnitOffsetModel)
    fused = fused_plugins(run.network)
    gamma = fused[0].inputs[2] if fused else None
    expected = run.tensors["model.layers.0.post_attention_layernorm.weight"] + np.float16(1)
    check(len(fused) == 4 and gamma.layer.kind == "constant" and gamma.dtype is fake.float16
          and np.array_equal(gamma.layer.params["array"], expected),
          "unit-offset RMSNorm (weight before the cast): 4 fused, gamma = the FP16 constant 1 + weight")
    same_numbers(fake, np, run, plain, 2, "unit-offset RMSNorm")


def case_fp32_mlp(builder, tool, fake, np):
    ops, qwen3 = builder["ops"], builder["qwen3"]

    class F32Layer(qwen3.Qwen3DecoderLayer):
        mlp_class = ops.FP32GatedMLP

    class F32Model(qwen3.Qwen3Model):
        layer_class = F32Layer

    plain = define(builder, tool, hooked=False, model=F32Model)
    run = define(builder, tool, model=F32Model)
    lines = run.report.lines()
    check(len(fused_plugins(run.network)) == 2 and len(plain_plugins(run.network)) == 2
          and "#2 left 'model.layers.0.mlp.down_proj': the all-reduce's output is used by FP32GatedMLP.forward" in lines[1],
          f"FP32 MLP all-reduce (forward_f32): left, the attention ones fused ({lines[1]})")
    same_numbers(fake, np, run, plain, 2, "FP32 MLP")


def case_edgellm_creator(builder, tool, fake, np):
    fake.use_edgellm_all_reduce_creator(True)
    try:
        define(builder, tool)
        check(False, "Edge-LLM's own AllReducePlugin creator: refused")
    except tool.FusionUnavailable as error:
        check("no field fusion_op, eps" in str(error) and "--plugin-path" in str(error),
              f"Edge-LLM's own AllReducePlugin creator: refused ({str(error)[:90]}...)")
    finally:
        fake.use_edgellm_all_reduce_creator(False)


def case_pinning(builder, tool, fake, np):
    tool.check_builder()
    check(True, "tensorrt-edgellm 0.11.0's files: accepted")
    for kwargs, what in (({"version": "0.12.0"}, "another version"),
                         ({"expected": {"ops/tensor.py": "0" * 64}}, "a changed ops/tensor.py")):
        try:
            tool.check_builder(**kwargs)
            check(False, f"{what}: refused")
        except tool.Refused as error:
            check(True, f"{what}: refused ({str(error)[:80]}...)")
    saved = tool.installed_version
    tool.installed_version = lambda: "0.10.1"
    try:
        check(tool.main(["--help"]) == 2, "the wrapper exits 2 on tensorrt-edgellm 0.10.1 before patching")
    finally:
        tool.installed_version = saved


def case_wrapper(builder, tool, fake, np):
    Tensor, Net = builder["ops"].Tensor, builder["backend"].Net
    before = (Tensor.__add__, Net.rmsnorm, builder["ops"].functional.all_reduce)
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            tool.main(["--help"])
        check(False, "the wrapper runs the builder's own command line")
    except SystemExit as done:  # argparse's --help
        check(done.code == 0 and "--tp-rank" in text.getvalue() and "without an intermediate" in text.getvalue(),
              "the wrapper runs the builder's own command line (its --help)")
    check((Tensor.__add__, Net.rmsnorm, builder["ops"].functional.all_reduce) == before,
          "the hooks are removed when the builder returns")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--tool", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    if sys.version_info < (3, 10):
        print(f"skipped: the direct builder needs Python 3.10+, this is {sys.version.split()[0]}")
        sys.exit(77)
    site = args.work / "site"
    site.mkdir(parents=True, exist_ok=True)
    extract(args.wheel, site)
    ensure_numpy(args.work)
    import numpy as np
    sys.path.insert(0, str(HERE))
    import fake_tensorrt as fake
    sys.modules["tensorrt"] = fake
    sys.path.insert(0, str(site))
    spec = importlib.util.spec_from_file_location("edgellm_build_fused", args.tool)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    builder = import_builder()

    for case in (lambda *a: case_qwen3_tp2(*a, externalize=True), lambda *a: case_qwen3_tp2(*a, externalize=False),
                 case_rank1, case_tp1, case_deepstack, case_layernorm, case_unit_offset, case_fp32_mlp, case_edgellm_creator,
                 case_pinning, case_wrapper):
        case(builder, tool, fake, np)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
