//! Builds small ONNX graphs for the tests: one all-reduce + residual + RMSNorm chain in each of
//! the forms exporters write, and a way to break it.
#![allow(dead_code)]

use edgellm_allreduce_fuse::dtype::{BFLOAT16, FLOAT, FLOAT16, INT64};
use edgellm_allreduce_fuse::proto::{
    attribute_proto::AttributeType, tensor_shape_proto::dimension, tensor_shape_proto::Dimension, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use edgellm_allreduce_fuse::report::{Outcome, Report};
use edgellm_allreduce_fuse::{fuse, Options};
use half::{bf16, f16};
use std::path::Path;

pub const HIDDEN: i64 = 64;
pub const TOKENS: i64 = -1; // a symbolic dimension, "tokens"

pub fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), type_: AttributeType::INT.into(), i, ..Default::default() }
}

pub fn float_attr(name: &str, f: f32) -> AttributeProto {
    AttributeProto { name: name.into(), type_: AttributeType::FLOAT.into(), f, ..Default::default() }
}

pub fn ints_attr(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto { name: name.into(), type_: AttributeType::INTS.into(), ints: ints.to_vec(), ..Default::default() }
}

pub fn value_info(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            value: Some(if d == TOKENS {
                dimension::Value::DimParam("tokens".into())
            } else {
                dimension::Value::DimValue(d)
            }),
            ..Default::default()
        })
        .collect();
    let tensor = type_proto::Tensor {
        elem_type: elem,
        shape: Some(TensorShapeProto { dim, ..Default::default() }).into(),
        ..Default::default()
    };
    ValueInfoProto {
        name: name.into(),
        type_: Some(TypeProto { value: Some(type_proto::Value::TensorType(tensor)), ..Default::default() }).into(),
        ..Default::default()
    }
}

/// A tensor of `elem` holding `values` (raw little-endian data).
pub fn tensor(name: &str, elem: i32, dims: &[i64], values: &[f64]) -> TensorProto {
    let raw_data: Vec<u8> = match elem {
        FLOAT => values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
        FLOAT16 => values.iter().flat_map(|&v| f16::from_f64(v).to_le_bytes()).collect(),
        BFLOAT16 => values.iter().flat_map(|&v| bf16::from_f64(v).to_le_bytes()).collect(),
        INT64 => values.iter().flat_map(|&v| (v as i64).to_le_bytes()).collect(),
        _ => panic!("tensor type {elem} is not built by the tests"),
    };
    TensorProto { name: name.into(), data_type: elem, dims: dims.to_vec(), raw_data, ..Default::default() }
}

#[derive(Default)]
pub struct Graph {
    pub nodes: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
    pub inputs: Vec<ValueInfoProto>,
    pub outputs: Vec<ValueInfoProto>,
    pub infos: Vec<ValueInfoProto>,
    pub opset: i64,
}

impl Graph {
    pub fn node(&mut self, op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> &mut NodeProto {
        self.nodes.push(NodeProto {
            op_type: op.into(),
            name: format!("{op}_{}", self.nodes.len()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        });
        self.nodes.last_mut().unwrap()
    }

    pub fn model(self) -> ModelProto {
        let opsets = [("", self.opset), ("trt_edgellm", 1), ("custom", 1)];
        ModelProto {
            ir_version: 10,
            opset_import: opsets
                .iter()
                .map(|(d, v)| OperatorSetIdProto { domain: d.to_string(), version: *v, ..Default::default() })
                .collect(),
            producer_name: "edgellm-allreduce-fuse tests".into(),
            graph: Some(GraphProto {
                name: "chain".into(),
                node: self.nodes,
                initializer: self.initializers,
                input: self.inputs,
                output: self.outputs,
                value_info: self.infos,
                ..Default::default()
            })
            .into(),
            ..Default::default()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Square {
    Pow,
    Mul,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Inverse {
    SqrtReciprocal,
    SqrtDivOne,
    SqrtDivX,
    Rsqrt,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Weight {
    /// `Cast back -> Mul weight` (Edge-LLM's `weight.to(dtype) * x.to(dtype)`).
    AfterCast,
    /// `Mul weight(fp32 constant) -> Cast back`.
    BeforeCastConstant,
    /// `Mul Cast(weight -> fp32) -> Cast back`.
    BeforeCastUpcast,
}

/// One chain: `x -> AllReducePlugin [-> Reshape] [-> + bias] -> + residual -> RMSNorm -> normed`,
/// with `y = normed * sum` reading both of the fused node's outputs.
#[derive(Clone, Debug)]
pub struct Spec {
    pub elem: i32,
    pub cast_pair: bool,
    pub square: Square,
    pub inverse: Inverse,
    pub weight: Weight,
    pub residual_first: bool,
    /// A bias Add (its `true`: the bias is the first operand).
    pub bias: Option<bool>,
    /// ReduceMean's axes as an attribute (opset 13) instead of an input (opset 18).
    pub axes_attribute: bool,
    /// eps from a `Constant` node instead of an initializer.
    pub eps_constant_node: bool,
    /// x is `[tokens, hidden]` and a Reshape to `[tokens, 1, hidden]` follows the all-reduce.
    pub reshape: bool,
    /// ONNX's RMSNormalization instead of primitive ops.
    pub rms_normalization: bool,
    pub eps: f32,
}

impl Default for Spec {
    /// Edge-LLM 0.11's decoder layer as its exporter writes it.
    fn default() -> Self {
        Spec {
            elem: FLOAT16,
            cast_pair: true,
            square: Square::Pow,
            inverse: Inverse::SqrtReciprocal,
            weight: Weight::AfterCast,
            residual_first: true,
            bias: None,
            axes_attribute: false,
            eps_constant_node: false,
            reshape: false,
            rms_normalization: false,
            eps: 1e-5,
        }
    }
}

pub fn gamma_values() -> Vec<f64> {
    (0..HIDDEN).map(|i| 1.0 + 0.001 * i as f64 + 1e-7).collect()
}

pub fn build(spec: &Spec) -> ModelProto {
    build_graph(spec).model()
}

pub fn build_graph(spec: &Spec) -> Graph {
    let t = spec.elem;
    let act = [TOKENS, 1, HIDDEN];
    let mut g = Graph {
        opset: if spec.rms_normalization {
            23
        } else if spec.axes_attribute {
            13
        } else {
            18
        },
        ..Default::default()
    };
    let x_dims: &[i64] = if spec.reshape { &[TOKENS, HIDDEN] } else { &act };
    g.inputs.push(value_info("x", t, x_dims));
    g.inputs.push(value_info("residual", t, &act));
    g.node("AllReducePlugin", &["x"], &["ar_out"], vec![int_attr("tp_size", 2)]).domain = "trt_edgellm".into();
    g.infos.push(value_info("ar_out", t, x_dims));
    let mut h = "ar_out".to_string();
    if spec.reshape {
        g.initializers.push(tensor("shape_3d", INT64, &[3], &[-1.0, 1.0, HIDDEN as f64]));
        g.node("Reshape", &["ar_out", "shape_3d"], &["ar_view"], vec![]);
        g.infos.push(value_info("ar_view", t, &act));
        h = "ar_view".into();
    }
    if let Some(bias_first) = spec.bias {
        g.initializers.push(tensor("bias", t, &[HIDDEN], &vec![0.5; HIDDEN as usize]));
        let ins = if bias_first { ["bias", h.as_str()] } else { [h.as_str(), "bias"] };
        g.node("Add", &ins, &["biased"], vec![]);
        h = "biased".into();
    }
    let ins = if spec.residual_first { ["residual", h.as_str()] } else { [h.as_str(), "residual"] };
    g.node("Add", &ins, &["sum"], vec![]);
    g.infos.push(value_info("sum", t, &act));
    if spec.rms_normalization {
        g.initializers.push(tensor("gamma", t, &[HIDDEN], &gamma_values()));
        g.node(
            "RMSNormalization",
            &["sum", "gamma"],
            &["normed"],
            vec![float_attr("epsilon", spec.eps), int_attr("axis", -1)],
        );
    } else {
        norm_primitive(&mut g, spec);
    }
    g.node("Mul", &["normed", "sum"], &["y"], vec![]);
    g.outputs.push(value_info("y", t, &act));
    g.outputs.push(value_info("sum", t, &act));
    g
}

fn norm_primitive(g: &mut Graph, spec: &Spec) {
    let t = spec.elem;
    let xf = if spec.cast_pair {
        g.node("Cast", &["sum"], &["xf"], vec![int_attr("to", FLOAT as i64)]);
        "xf"
    } else {
        "sum"
    };
    let compute = if spec.cast_pair { FLOAT } else { t };
    match spec.square {
        Square::Pow => {
            g.initializers.push(tensor("two", compute, &[], &[2.0]));
            g.node("Pow", &[xf, "two"], &["sq"], vec![]);
        }
        Square::Mul => {
            g.node("Mul", &[xf, xf], &["sq"], vec![]);
        }
    }
    if spec.axes_attribute {
        g.node("ReduceMean", &["sq"], &["mean"], vec![ints_attr("axes", &[-1]), int_attr("keepdims", 1)]);
    } else {
        g.initializers.push(tensor("axes", INT64, &[1], &[-1.0]));
        g.node("ReduceMean", &["sq", "axes"], &["mean"], vec![int_attr("keepdims", 1)]);
    }
    if spec.eps_constant_node {
        let value = tensor("", compute, &[], &[spec.eps as f64]);
        let attr = AttributeProto {
            name: "value".into(),
            type_: AttributeType::TENSOR.into(),
            t: Some(value).into(),
            ..Default::default()
        };
        g.node("Constant", &[], &["eps"], vec![attr]);
    } else {
        g.initializers.push(tensor("eps", compute, &[], &[spec.eps as f64]));
    }
    g.node("Add", &["mean", "eps"], &["var_eps"], vec![]);
    let n = match spec.inverse {
        Inverse::Rsqrt => {
            g.node("Rsqrt", &["var_eps"], &["inv"], vec![]).domain = "custom".into();
            g.node("Mul", &[xf, "inv"], &["n"], vec![]);
            "n"
        }
        Inverse::SqrtReciprocal | Inverse::SqrtDivOne | Inverse::SqrtDivX => {
            g.node("Sqrt", &["var_eps"], &["root"], vec![]);
            match spec.inverse {
                Inverse::SqrtReciprocal => {
                    g.node("Reciprocal", &["root"], &["inv"], vec![]);
                    g.node("Mul", &[xf, "inv"], &["n"], vec![]);
                }
                Inverse::SqrtDivOne => {
                    g.initializers.push(tensor("one", compute, &[], &[1.0]));
                    g.node("Div", &["one", "root"], &["inv"], vec![]);
                    g.node("Mul", &["inv", xf], &["n"], vec![]);
                }
                _ => {
                    g.node("Div", &[xf, "root"], &["n"], vec![]);
                }
            }
            "n"
        }
    };
    if !spec.cast_pair {
        g.initializers.push(tensor("gamma", t, &[HIDDEN], &gamma_values()));
        g.node("Mul", &[n, "gamma"], &["normed"], vec![]);
        return;
    }
    match spec.weight {
        Weight::AfterCast => {
            g.initializers.push(tensor("gamma", t, &[HIDDEN], &gamma_values()));
            g.node("Cast", &[n], &["nc"], vec![int_attr("to", t as i64)]);
            g.node("Mul", &["gamma", "nc"], &["normed"], vec![]);
        }
        Weight::BeforeCastConstant => {
            g.initializers.push(tensor("gamma32", FLOAT, &[HIDDEN], &gamma_values()));
            g.node("Mul", &[n, "gamma32"], &["nw"], vec![]);
            g.node("Cast", &["nw"], &["normed"], vec![int_attr("to", t as i64)]);
        }
        Weight::BeforeCastUpcast => {
            g.initializers.push(tensor("gamma", t, &[HIDDEN], &gamma_values()));
            g.node("Cast", &["gamma"], &["gamma_up"], vec![int_attr("to", FLOAT as i64)]);
            g.node("Mul", &[n, "gamma_up"], &["nw"], vec![]);
            g.node("Cast", &["nw"], &["normed"], vec![int_attr("to", t as i64)]);
        }
    }
}

/// The pass on `model` with the default options.
pub fn run(model: &mut ModelProto) -> Report {
    fuse(model, &Options::default(), Path::new(".")).expect("the pass runs")
}

/// The model's nodes.
pub fn nodes(model: &ModelProto) -> &[NodeProto] {
    &model.graph.as_ref().unwrap().node
}

/// The pass leaves the graph as it was and says why.
pub fn refuses(mut model: ModelProto, why: &str) {
    let before = model.clone();
    let report = run(&mut model);
    assert_eq!(report.fused(), 0, "{report}");
    match &report.candidates[0].outcome {
        Outcome::Left(reason) => assert!(reason.contains(why), "reason '{reason}' should say '{why}'"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(model, before, "a refused chain leaves the graph as it was");
}
