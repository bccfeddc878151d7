//! Each RMSNorm form and chain variant the pass matches, and each one it refuses, on graphs built
//! here: the rewrite is structurally valid ONNX with the expected node, fields and wiring.

mod common;

use std::path::Path;

use common::{
    build, build_graph, gamma_values, int_attr, nodes, refuses, run, tensor, value_info, Inverse, Spec, Square, Weight,
    HIDDEN,
};
use edgellm_allreduce_fuse::dtype::{BFLOAT16, FLOAT, FLOAT16};
use edgellm_allreduce_fuse::graph::{float_attr, int_attr as read_int};
use edgellm_allreduce_fuse::proto::{ModelProto, NodeProto};
use edgellm_allreduce_fuse::report::{Outcome, Report};
use edgellm_allreduce_fuse::rewrite::Fields;
use edgellm_allreduce_fuse::{check_structure, constant, fuse, Options};

fn fused_node(model: &ModelProto) -> &NodeProto {
    let fused: Vec<_> = nodes(model).iter().filter(|n| n.op_type == "AllReducePlugin").collect();
    assert_eq!(fused.len(), 1, "one AllReducePlugin node remains");
    fused[0]
}

/// The pass fused the chain: one fused node with the plugin's fields, inputs
/// `(x, residual, gamma[, bias])`, outputs `(normed, sum)`, and only the graph's other nodes left.
fn assert_fused(model: &ModelProto, report: &Report, spec: &Spec, x: &str, gamma: &str) {
    assert_eq!(report.fused(), 1, "{report}");
    check_structure(model).expect("the rewritten graph is valid");
    let node = fused_node(model);
    assert_eq!(node.domain, "trt_edgellm");
    assert_eq!(read_int(node, "tp_size"), Some(2));
    assert_eq!(read_int(node, "fusion_op"), Some(1));
    // eps as the graph holds it: in fp16 when the norm computes in fp16.
    let eps = if !spec.cast_pair && spec.elem == FLOAT16 { half::f16::from_f32(spec.eps).to_f32() } else { spec.eps };
    assert_eq!(float_attr(node, "eps"), Some(eps));
    assert_eq!(read_int(node, "has_bias"), spec.bias.map(|_| 1));
    let mut inputs = vec![x, "residual", gamma];
    if spec.bias.is_some() {
        inputs.push("bias");
    }
    assert_eq!(node.input, inputs);
    assert_eq!(node.output, ["normed", "sum"]);
    let left: Vec<&str> = nodes(model).iter().map(|n| n.op_type.as_str()).collect();
    let expected: &[&str] =
        if spec.reshape { &["Reshape", "AllReducePlugin", "Mul"] } else { &["AllReducePlugin", "Mul"] };
    assert_eq!(left, expected, "the chain's other nodes are gone, the consumer stays");
    let consumer = nodes(model).last().unwrap();
    assert_eq!(consumer.input, ["normed", "sum"], "the consumer reads both fused outputs");
    let graph = model.graph.as_ref().unwrap();
    let names: Vec<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    for dead in ["two", "axes", "eps", "one", "gamma32"] {
        assert!(!names.contains(&dead), "initializer '{dead}' fed only the chain and is removed: {names:?}");
    }
    assert!(graph.value_info.iter().all(|v| v.name != "ar_out"), "the all-reduce's own output is gone");
}

fn fuses(spec: Spec) {
    let mut model = build(&spec);
    let report = run(&mut model);
    let x = if spec.reshape { "ar_view" } else { "x" };
    assert_fused(&model, &report, &spec, x, "gamma");
}

#[test]
fn edge_llm_default_decoder_form() {
    fuses(Spec::default());
}

#[test]
fn residual_add_in_either_operand_order() {
    fuses(Spec { residual_first: false, ..Spec::default() });
}

#[test]
fn no_cast_pair_fp32() {
    fuses(Spec { elem: FLOAT, cast_pair: false, ..Spec::default() });
}

#[test]
fn no_cast_pair_fp16() {
    fuses(Spec { cast_pair: false, ..Spec::default() });
}

#[test]
fn bf16() {
    fuses(Spec { elem: BFLOAT16, ..Spec::default() });
}

#[test]
fn cast_pair_in_fp32_is_a_no_op_pair() {
    fuses(Spec { elem: FLOAT, ..Spec::default() });
}

#[test]
fn square_as_mul() {
    fuses(Spec { square: Square::Mul, ..Spec::default() });
}

#[test]
fn sqrt_then_div_by_the_root() {
    fuses(Spec { inverse: Inverse::SqrtDivX, ..Spec::default() });
}

#[test]
fn sqrt_then_one_over_the_root() {
    fuses(Spec { inverse: Inverse::SqrtDivOne, ..Spec::default() });
}

#[test]
fn rsqrt_of_any_domain() {
    fuses(Spec { inverse: Inverse::Rsqrt, ..Spec::default() });
}

#[test]
fn reduce_mean_axes_attribute_opset_13() {
    fuses(Spec { axes_attribute: true, ..Spec::default() });
}

#[test]
fn eps_from_a_constant_node() {
    let spec = Spec { eps_constant_node: true, ..Spec::default() };
    fuses(spec.clone());
    let mut model = build(&spec);
    run(&mut model);
    assert!(nodes(&model).iter().all(|n| n.op_type != "Constant"), "the eps Constant went with the chain");
}

#[test]
fn rms_normalization_op() {
    fuses(Spec { rms_normalization: true, ..Spec::default() });
}

#[test]
fn bias_add_either_order() {
    fuses(Spec { bias: Some(false), ..Spec::default() });
    fuses(Spec { bias: Some(true), residual_first: false, ..Spec::default() });
}

#[test]
fn reshape_after_the_all_reduce_moves_before_the_fused_node() {
    let spec = Spec { reshape: true, ..Spec::default() };
    fuses(spec.clone());
    let mut model = build(&spec);
    run(&mut model);
    let reshape = &nodes(&model)[0];
    assert_eq!(reshape.input, ["x", "shape_3d"], "the Reshape now reads x");
    assert_eq!(reshape.output, ["ar_view"]);
}

#[test]
fn weight_upcast_before_the_cast_back_reads_the_original_weight() {
    let spec = Spec { weight: Weight::BeforeCastUpcast, ..Spec::default() };
    fuses(spec.clone());
    let mut model = build(&spec);
    run(&mut model);
    assert!(nodes(&model).iter().all(|n| n.op_type != "Cast"), "the weight's upcast went with the chain");
}

#[test]
fn fp32_weight_before_the_cast_back_becomes_a_new_initializer_of_x_type() {
    for elem in [FLOAT16, BFLOAT16] {
        let spec = Spec { elem, weight: Weight::BeforeCastConstant, ..Spec::default() };
        let mut model = build(&spec);
        let report = run(&mut model);
        let name = if elem == FLOAT16 { "gamma32_fp16" } else { "gamma32_bf16" };
        assert_fused(&model, &report, &spec, "x", name);
        let graph = model.graph.as_ref().unwrap();
        let gamma = graph.initializer.iter().find(|t| t.name == name).expect("the converted weight");
        assert_eq!((gamma.data_type, gamma.dims.as_slice()), (elem, &[HIDDEN][..]));
        let values = constant::as_f64(gamma, Path::new(".")).unwrap().unwrap();
        let rounded: Vec<f64> = gamma_values()
            .iter()
            .map(|&v| {
                if elem == FLOAT16 {
                    half::f16::from_f32(v as f32).to_f64()
                } else {
                    half::bf16::from_f32(v as f32).to_f64()
                }
            })
            .collect();
        assert_eq!(values, rounded, "fp32 values rounded to nearest even");
        assert!(matches!(&report.candidates[0].outcome, Outcome::Fused { gamma_from: Some(f), .. } if f == "gamma32"));
    }
}

#[test]
fn plugin_fields_from_options_and_only() {
    let mut model = build(&Spec::default());
    let options = Options { only: vec![1], fields: Fields { strategy: Some(2), config: Some(1) } };
    let report = fuse(&mut model, &options, Path::new(".")).unwrap();
    assert_eq!(report.fused(), 1);
    let node = fused_node(&model);
    assert_eq!((read_int(node, "strategy"), read_int(node, "config")), (Some(2), Some(1)));
    let mut model = build(&Spec::default());
    let err = fuse(&mut model, &Options { only: vec![2], ..Options::default() }, Path::new(".")).unwrap_err();
    assert!(err.to_string().contains("only 1 candidate"), "{err}");
}

#[test]
fn only_leaves_the_other_candidates() {
    // Two chains in sequence: the second's residual is the first's sum.
    let spec = Spec::default();
    let mut g = build_graph(&spec);
    let mut second = build_graph(&spec);
    let rename = |s: &mut String| {
        if s != "residual" && !s.is_empty() {
            *s = format!("{s}_2");
        }
        if s == "residual" {
            *s = "sum".into();
        }
    };
    for n in &mut second.nodes {
        n.input.iter_mut().for_each(rename);
        n.output.iter_mut().for_each(rename);
        n.name.push_str("_2");
    }
    for t in &mut second.initializers {
        t.name.push_str("_2");
    }
    g.inputs.push(value_info("x_2", FLOAT16, &[common::TOKENS, 1, HIDDEN]));
    g.infos.push(value_info("ar_out_2", FLOAT16, &[common::TOKENS, 1, HIDDEN]));
    g.nodes.extend(second.nodes);
    g.initializers.extend(second.initializers);
    g.outputs.push(value_info("y_2", FLOAT16, &[common::TOKENS, 1, HIDDEN]));
    let model = g.model();
    let mut all = model.clone();
    assert_eq!(run(&mut all).fused(), 2);
    check_structure(&all).unwrap();
    let mut one = model.clone();
    let report = fuse(&mut one, &Options { only: vec![2], ..Options::default() }, Path::new(".")).unwrap();
    assert_eq!(report.candidates[0].outcome, Outcome::NotSelected);
    assert!(matches!(report.candidates[1].outcome, Outcome::Fused { .. }));
    check_structure(&one).unwrap();
    let plugins: Vec<_> = nodes(&one).iter().filter(|n| n.op_type == "AllReducePlugin").collect();
    assert_eq!(plugins.len(), 2);
    assert_eq!(read_int(plugins[0], "fusion_op"), None, "candidate 1 is untouched");
    assert_eq!(read_int(plugins[1], "fusion_op"), Some(1));
    assert!(nodes(&one).iter().any(|n| n.op_type == "Pow"), "candidate 1's norm stays");
}

fn with_extra_reader(value: &str) -> ModelProto {
    let mut g = build_graph(&Spec::default());
    g.node("Neg", &[value], &["other_reader"], vec![]);
    g.outputs.push(value_info("other_reader", FLOAT, &[]));
    g.model()
}

#[test]
fn refuses_an_intermediate_with_another_consumer() {
    refuses(with_extra_reader("mean"), "consumers");
    refuses(with_extra_reader("xf"), "also read outside the norm");
    refuses(with_extra_reader("ar_out"), "consumers");
    refuses(with_extra_reader("nc"), "consumers");
}

#[test]
fn refuses_an_intermediate_that_is_a_graph_output() {
    let mut g = build_graph(&Spec::default());
    g.outputs.push(value_info("inv", FLOAT, &[]));
    refuses(g.model(), "graph output");
}

#[test]
fn refuses_shapes_that_disagree() {
    let mut g = build_graph(&Spec::default());
    g.inputs[1] = value_info("residual", FLOAT16, &[common::TOKENS, 1, 32]);
    refuses(g.model(), "has shape");
    let mut g = build_graph(&Spec::default());
    let gamma = g.initializers.iter_mut().find(|t| t.name == "gamma").unwrap();
    *gamma = tensor("gamma", FLOAT16, &[32], &[1.0; 32]);
    refuses(g.model(), "the plugin needs 1-D [64]");
    let mut g = build_graph(&Spec::default());
    let axes = g.initializers.iter_mut().find(|t| t.name == "axes").unwrap();
    *axes = tensor("axes", edgellm_allreduce_fuse::dtype::INT64, &[1], &[1.0]);
    refuses(g.model(), "does not reduce the last axis");
}

#[test]
fn refuses_types_that_disagree() {
    let mut g = build_graph(&Spec::default());
    g.inputs[1] = value_info("residual", FLOAT, &[common::TOKENS, 1, HIDDEN]);
    refuses(g.model(), "the residual 'residual' is fp32");
    let mut g = build_graph(&Spec::default());
    let cast = g.nodes.iter_mut().find(|n| n.output == ["nc"]).unwrap();
    cast.attribute = vec![int_attr("to", BFLOAT16 as i64)];
    refuses(g.model(), "casts back to bf16");
    let mut g = build_graph(&Spec::default());
    g.inputs[0] = value_info("x", edgellm_allreduce_fuse::dtype::INT32, &[common::TOKENS, 1, HIDDEN]);
    refuses(g.model(), "int32");
}

#[test]
fn refuses_eps_that_is_not_a_constant() {
    let mut g = build_graph(&Spec::default());
    g.initializers.retain(|t| t.name != "eps");
    g.inputs.push(value_info("eps", FLOAT, &[]));
    refuses(g.model(), "eps 'eps'");
}

#[test]
fn refuses_an_all_reduce_already_fused_or_without_a_norm() {
    let mut g = build_graph(&Spec::default());
    g.nodes[0].attribute.push(int_attr("fusion_op", 1));
    refuses(g.model(), "already fused");
    let mut g = common::Graph { opset: 18, ..Default::default() };
    let act = [common::TOKENS, 1, HIDDEN];
    g.inputs.push(value_info("x", FLOAT16, &act));
    g.inputs.push(value_info("residual", FLOAT16, &act));
    g.node("AllReducePlugin", &["x"], &["ar_out"], vec![int_attr("tp_size", 2)]).domain = "trt_edgellm".into();
    g.node("Add", &["residual", "ar_out"], &["sum"], vec![]);
    g.node("Neg", &["sum"], &["y"], vec![]);
    g.outputs.push(value_info("y", FLOAT16, &act));
    refuses(g.model(), "no RMSNorm reads the residual sum");
}

#[test]
fn malformed_graphs_are_refused_not_panicked_on() {
    let mut g = build_graph(&Spec::default());
    g.nodes.iter_mut().find(|n| n.op_type == "ReduceMean").unwrap().output.clear();
    refuses(g.model(), "has no consumer");
    let mut g = build_graph(&Spec::default());
    g.initializers.iter_mut().find(|t| t.name == "eps").unwrap().dims = vec![i64::MAX, 4];
    refuses(g.model(), "not a one-element constant");
    let mut g = build_graph(&Spec::default());
    g.nodes.iter_mut().find(|n| n.output == ["sum"]).unwrap().input.truncate(1);
    refuses(g.model(), "'ar_out' has no consumer");
}
