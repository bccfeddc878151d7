//! Layout ops between the residual sum and the norm (Edge-LLM 0.11's Qwen3.5 hybrid layers
//! reshape the sum on its way to the next norm and the next residual Add), and element types
//! inferred where the graph declares none.

mod common;

use common::{build_graph, int_attr, ints_attr, nodes, refuses, run, tensor, value_info, Graph, Spec, HIDDEN, TOKENS};
use edgellm_allreduce_fuse::check_structure;
use edgellm_allreduce_fuse::dtype::{FLOAT, FLOAT16, INT64};
use edgellm_allreduce_fuse::graph::int_attr as read_int;
use edgellm_allreduce_fuse::proto::{ModelProto, NodeProto};
use edgellm_allreduce_fuse::report::{Outcome, Report};

/// The default chain with `layout` (nodes reading "sum", ending in "view") put between the
/// residual sum and the norm; the graph's other reader of the sum (`y = normed * sum`) reads
/// "view" too, as the next residual Add of a hybrid layer does.
fn through(spec: &Spec, layout: impl FnOnce(&mut Graph)) -> ModelProto {
    let mut g = build_graph(spec);
    for n in &mut g.nodes {
        n.input.iter_mut().filter(|i| *i == "sum").for_each(|i| *i = "view".into());
    }
    let at = g.nodes.iter().position(|n| n.output == ["sum"]).unwrap() + 1;
    let tail = g.nodes.split_off(at);
    layout(&mut g);
    g.nodes.extend(tail);
    g.model()
}

fn reshape_to(target: &'static [f64]) -> impl FnOnce(&mut Graph) {
    move |g: &mut Graph| {
        g.initializers.push(tensor("view_shape", INT64, &[target.len() as i64], target));
        g.node("Reshape", &["sum", "view_shape"], &["view"], vec![]);
    }
}

/// Fused, with the layout ops kept reading the residual sum and the graph's reader of the view
/// unchanged; returns the fused node's normed output.
fn assert_fused_through(model: &ModelProto, report: &Report, kept: &[&str]) -> String {
    assert_eq!(report.fused(), 1, "{report}");
    check_structure(model).expect("the rewritten graph is valid");
    let fused: Vec<&NodeProto> = nodes(model).iter().filter(|n| n.op_type == "AllReducePlugin").collect();
    assert_eq!(fused.len(), 1);
    assert_eq!(read_int(fused[0], "fusion_op"), Some(1));
    assert_eq!(fused[0].input, ["x", "residual", "gamma"]);
    assert_eq!(fused[0].output[1], "sum", "residual_out keeps the sum's name");
    let original = |n: &&NodeProto| !n.name.ends_with("/fused_normed");
    let first = nodes(model).iter().filter(original).find(|n| n.op_type == kept[0]).expect("the first layout op stays");
    assert_eq!(first.input[0], "sum", "it reads the fused node's residual_out");
    let last = nodes(model).iter().find(|n| n.output == ["view"]).expect("the view is still made");
    assert_eq!(last.op_type, *kept.last().unwrap());
    let y = nodes(model).iter().find(|n| n.output == ["y"]).unwrap();
    assert_eq!(y.input, ["normed", "view"], "the view's other reader is unchanged");
    for op in ["Pow", "ReduceMean", "Sqrt", "Reciprocal"] {
        assert!(nodes(model).iter().all(|n| n.op_type != op), "the norm's {op} is gone");
    }
    match &report.candidates[0].outcome {
        Outcome::Fused { norm_through, .. } => assert_eq!(norm_through.len(), kept.len(), "{report}"),
        other => panic!("{other:?}"),
    }
    fused[0].output[0].clone()
}

#[test]
fn reshape_that_keeps_the_shape_is_followed_without_a_copy() {
    // [0, 1, 64] of [tokens, 1, 64]: the same shape (0 copies tokens).
    let mut model = through(&Spec::default(), reshape_to(&[0.0, 1.0, HIDDEN as f64]));
    let report = run(&mut model);
    let normed = assert_fused_through(&model, &report, &["Reshape"]);
    assert_eq!(normed, "normed", "no copy: the fused node makes the norm's output");
    assert_eq!(nodes(&model).iter().filter(|n| n.op_type == "Reshape").count(), 1);
    assert!(report.to_string().contains("norm read through Reshape 'Reshape_"), "{report}");
}

#[test]
fn reshape_keeping_the_hidden_dim_is_followed_and_copied_after_the_normed_output() {
    // [-1, 64]: [tokens, 1, 64] -> [tokens, 64]; rows stay rows, the shape changes.
    for spec in [Spec::default(), Spec { rms_normalization: true, ..Spec::default() }] {
        let mut model = through(&spec, reshape_to(&[-1.0, HIDDEN as f64]));
        let report = run(&mut model);
        let normed = assert_fused_through(&model, &report, &["Reshape"]);
        assert_ne!(normed, "normed");
        let copy = nodes(&model).iter().find(|n| n.output == ["normed"]).expect("a copy makes the norm's output");
        assert_eq!((copy.op_type.as_str(), copy.input.as_slice()), ("Reshape", &[normed, "view_shape".into()][..]));
        assert!(report.to_string().contains("copied after the normed output"), "{report}");
    }
}

#[test]
fn squeeze_identity_and_cancelling_cast_pair_are_followed() {
    let mut model = through(&Spec::default(), |g| {
        g.initializers.push(tensor("axis1", INT64, &[1], &[1.0]));
        g.node("Squeeze", &["sum", "axis1"], &["squeezed"], vec![]);
        g.node("Identity", &["squeezed"], &["same"], vec![]);
        g.node("Cast", &["same"], &["up"], vec![int_attr("to", FLOAT as i64)]);
        g.node("Cast", &["up"], &["view"], vec![int_attr("to", FLOAT16 as i64)]);
    });
    let report = run(&mut model);
    let normed = assert_fused_through(&model, &report, &["Squeeze", "Identity", "Cast", "Cast"]);
    assert_ne!(normed, "normed", "Squeeze drops an axis: copied");
    // The copies, in order, from the fused output to the norm's output.
    let copies: Vec<&str> =
        nodes(&model).iter().filter(|n| n.name.ends_with("/fused_normed")).map(|n| n.op_type.as_str()).collect();
    assert_eq!(copies, ["Squeeze", "Identity", "Cast", "Cast"]);
}

#[test]
fn flatten_keeping_the_hidden_dim_is_followed() {
    // axis 1 of [tokens, 1, 64]: [tokens, 64].
    let mut model = through(&Spec::default(), |g| {
        g.node("Flatten", &["sum"], &["view"], vec![int_attr("axis", 1)]);
    });
    let report = run(&mut model);
    assert_ne!(assert_fused_through(&model, &report, &["Flatten"]), "normed");
}

#[test]
fn identity_only_needs_no_copy() {
    let mut model = through(&Spec::default(), |g| {
        g.node("Identity", &["sum"], &["view"], vec![]);
    });
    let report = run(&mut model);
    assert_eq!(assert_fused_through(&model, &report, &["Identity"]), "normed");
}

#[test]
fn layout_ops_that_change_the_hidden_dim_are_not_followed() {
    // [-1, 32]: rows of 64 become two rows of 32; a norm over them is another norm.
    refuses(through(&Spec::default(), reshape_to(&[-1.0, 32.0])), "last (hidden) dimension");
    refuses(
        through(&Spec::default(), |g| {
            g.node("Unsqueeze", &["sum"], &["view"], vec![ints_attr("axes", &[-1])]).name = "unsq".into();
        }),
        "Unsqueeze 'unsq' turns the residual sum 'sum' [tokens, 1, 64] into [tokens, 1, 64, 1]",
    );
    refuses(
        through(&Spec::default(), |g| {
            // axis 0: [1, tokens * 64]
            g.node("Flatten", &["sum"], &["view"], vec![int_attr("axis", 0)]);
        }),
        "into [1, ?]",
    );
}

#[test]
fn layout_ops_of_unknown_shapes_are_not_followed() {
    refuses(
        through(&Spec::default(), |g| {
            g.inputs.push(value_info("runtime_shape", INT64, &[2]));
            g.node("Reshape", &["sum", "runtime_shape"], &["view"], vec![]);
        }),
        "the shapes around it are not known",
    );
}

#[test]
fn a_cast_pair_that_rounds_is_not_followed() {
    // fp32 -> fp16 -> fp32 rounds the sum: the norm reads other values than the sum.
    let spec = Spec { elem: FLOAT, ..Spec::default() };
    refuses(
        through(&spec, |g| {
            g.node("Cast", &["sum"], &["down"], vec![int_attr("to", FLOAT16 as i64)]);
            g.node("Cast", &["down"], &["view"], vec![int_attr("to", FLOAT as i64)]);
        }),
        "the residual sum is cast to fp16, not fp32",
    );
}

/// The default chain with no value_info, x made from graph input "src" (of no declared type) by
/// `producer`, and the residual of type `residual` (0: none declared).
fn x_made_by(producer: impl FnOnce(&mut Graph), residual: i32) -> ModelProto {
    let mut g = build_graph(&Spec::default());
    g.infos.clear();
    g.inputs[0] = value_info("src", 0, &[TOKENS, 1, HIDDEN]);
    g.inputs[1] = value_info("residual", residual, &[TOKENS, 1, HIDDEN]);
    let tail = std::mem::take(&mut g.nodes);
    producer(&mut g);
    g.nodes.extend(tail);
    g.model()
}

fn fuses_as_fp16(mut model: ModelProto) {
    let report = run(&mut model);
    assert_eq!(report.fused(), 1, "{report}");
    check_structure(&model).unwrap();
    assert!(matches!(&report.candidates[0].outcome, Outcome::Fused { dtype, .. } if dtype == "fp16"), "{report}");
}

#[test]
fn types_are_inferred_without_value_info() {
    // From a Cast.
    fuses_as_fp16(x_made_by(
        |g| {
            g.node("Cast", &["src"], &["x"], vec![int_attr("to", FLOAT16 as i64)]);
        },
        0,
    ));
    // From the weight of a projection (any operand of MatMul / Gemm has the output's type).
    fuses_as_fp16(x_made_by(
        |g| {
            g.initializers.push(tensor("w", FLOAT16, &[HIDDEN, HIDDEN], &vec![0.0; (HIDDEN * HIDDEN) as usize]));
            g.node("MatMul", &["src", "w"], &["x"], vec![]);
        },
        0,
    ));
    // From the other operand of the residual Add, through a custom op nothing is known of.
    fuses_as_fp16(x_made_by(|g| g.node("Mystery", &["src"], &["x"], vec![]).domain = "custom".into(), FLOAT16));
}

#[test]
fn an_unknown_type_still_refuses() {
    refuses(
        x_made_by(|g| g.node("Mystery", &["src"], &["x"], vec![]).domain = "custom".into(), 0),
        "the type of its input 'x' is unknown",
    );
}

/// The default chain with `op` put after the norm's value `value` (made into `value_v`).
fn inside(value: &str, op: &str, shape: Option<&'static [f64]>) -> ModelProto {
    let mut g = build_graph(&Spec::default());
    let view = format!("{value}_v");
    for n in &mut g.nodes {
        n.input.iter_mut().filter(|i| *i == value).for_each(|i| *i = view.clone());
    }
    let at = g.nodes.iter().position(|n| n.output == [value]).unwrap() + 1;
    let tail = g.nodes.split_off(at);
    match shape {
        Some(target) => {
            g.initializers.push(tensor("inner_shape", INT64, &[target.len() as i64], target));
            g.node(op, &[value, "inner_shape"], &[&view], vec![]);
        }
        None => {
            g.node(op, &[value], &[&view], vec![]);
        }
    }
    g.nodes.extend(tail);
    g.model()
}

#[test]
fn shape_keeping_layout_ops_between_the_norm_pieces_go_with_the_norm() {
    for model in [
        inside("mean", "Identity", None),
        inside("inv", "Reshape", Some(&[0.0, 0.0, 1.0])),
        inside("root", "Identity", None),
        inside("var_eps", "Identity", None),
        inside("n", "Reshape", Some(&[0.0, 1.0, HIDDEN as f64])),
        inside("nc", "Identity", None),
    ] {
        let mut model = model;
        let report = run(&mut model);
        assert_eq!(report.fused(), 1, "{report}");
        check_structure(&model).unwrap();
        let left: Vec<&str> = nodes(&model).iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(left, ["AllReducePlugin", "Mul"], "the layout op went with the norm");
        assert!(report.to_string().contains("layout ops inside"), "{report}");
    }
}

#[test]
fn a_layout_op_between_the_norm_pieces_that_changes_the_shape_refuses() {
    // [tokens, 1, 1] -> [tokens, 1]: the Mul would broadcast differently.
    refuses(inside("inv", "Reshape", Some(&[-1.0, 1.0])), "feeds Reshape");
}

#[test]
fn a_layout_op_only_the_norm_read_goes_with_it() {
    let mut model = through(&Spec::default(), reshape_to(&[0.0, 1.0, HIDDEN as f64]));
    let y = model.graph.as_mut().unwrap().node.iter_mut().find(|n| n.output == ["y"]).unwrap();
    y.input[1] = "sum".into();
    let report = run(&mut model);
    assert_eq!(report.fused(), 1, "{report}");
    check_structure(&model).unwrap();
    let left: Vec<&str> = nodes(&model).iter().map(|n| n.op_type.as_str()).collect();
    assert_eq!(left, ["AllReducePlugin", "Mul"], "the Reshape, read by nothing now, is gone");
    assert!(model.graph.as_ref().unwrap().initializer.iter().all(|t| t.name != "view_shape"));
}
