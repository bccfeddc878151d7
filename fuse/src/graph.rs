//! A read-only index of a graph: who produces and who consumes each value, the types and shapes
//! the graph declares, and which values are constants; with the node and attribute helpers every
//! other layer reads nodes through. The pass's lowest layer (it uses only `constant`, `dtype` and
//! `error`): types and shapes the graph does not declare come from `infer` (`Infer::elem_type`,
//! `Infer::shape`), which only keeps its answers here.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::proto::{
    attribute_proto::AttributeType, tensor_shape_proto::dimension, type_proto, AttributeProto, GraphProto, NodeProto,
    TensorProto, ValueInfoProto,
};

use crate::constant;
use crate::dtype;
use crate::error::Result;

/// One dimension as the graph states it.
#[derive(Clone, Debug, PartialEq)]
pub enum Dim {
    Fixed(i64),
    Named(String),
    Unknown,
}

impl Dim {
    /// Whether two dimensions can be the same: only two different fixed sizes cannot (two
    /// symbolic names may still be equal at run time).
    pub fn compatible(&self, other: &Dim) -> bool {
        !matches!((self, other), (Dim::Fixed(a), Dim::Fixed(b)) if a != b)
    }
}

/// Two dimensions provably equal: the same fixed size or the same symbolic name.
pub fn same_dim(a: &Dim, b: &Dim) -> bool {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x == y,
        (Dim::Named(x), Dim::Named(y)) => x == y,
        _ => false,
    }
}

pub fn shape_text(shape: &[Dim]) -> String {
    let dims: Vec<String> = shape
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => n.to_string(),
            Dim::Named(s) => s.clone(),
            Dim::Unknown => "?".into(),
        })
        .collect();
    format!("[{}]", dims.join(", "))
}

pub struct GraphIndex<'g> {
    pub graph: &'g GraphProto,
    data_dir: &'g Path,
    producer: HashMap<&'g str, usize>,
    /// Node indices that read the value, once per node.
    consumers: HashMap<&'g str, Vec<usize>>,
    /// Values read by something other than a node of this graph: graph outputs and names that
    /// subgraphs (If/Loop/Scan bodies) take from this scope.
    escapes: HashSet<&'g str>,
    initializers: HashMap<&'g str, &'g TensorProto>,
    declared: HashMap<&'g str, &'g ValueInfoProto>,
    /// `infer`'s answers, by value (None: cannot be known), so that each value is inferred once
    /// per index; the rules live in `infer`, the index only keeps the results.
    pub(crate) inferred_types: RefCell<HashMap<String, Option<i32>>>,
    pub(crate) inferred_shapes: RefCell<HashMap<String, Option<Vec<Dim>>>>,
}

impl<'g> GraphIndex<'g> {
    pub fn new(graph: &'g GraphProto, data_dir: &'g Path) -> Self {
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut escapes = HashSet::new();
        for (i, node) in graph.node.iter().enumerate() {
            for out in node.output.iter().filter(|o| !o.is_empty()) {
                producer.insert(out.as_str(), i);
            }
            for input in node.input.iter().filter(|v| !v.is_empty()) {
                let list = consumers.entry(input.as_str()).or_default();
                if list.last() != Some(&i) && !list.contains(&i) {
                    list.push(i);
                }
            }
            for sub in subgraphs(node) {
                outer_names(sub, &mut escapes);
            }
        }
        escapes.extend(graph.output.iter().map(|o| o.name.as_str()));
        let initializers = graph.initializer.iter().map(|t| (t.name.as_str(), t)).collect();
        let declared =
            graph.value_info.iter().chain(&graph.input).chain(&graph.output).map(|v| (v.name.as_str(), v)).collect();
        GraphIndex {
            graph,
            data_dir,
            producer,
            consumers,
            escapes,
            initializers,
            declared,
            inferred_types: RefCell::default(),
            inferred_shapes: RefCell::default(),
        }
    }

    pub fn data_dir(&self) -> &Path {
        self.data_dir
    }

    pub fn node(&self, i: usize) -> &'g NodeProto {
        &self.graph.node[i]
    }

    pub fn producer(&self, value: &str) -> Option<usize> {
        self.producer.get(value).copied()
    }

    pub fn consumers(&self, value: &str) -> &[usize] {
        self.consumers.get(value).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Read outside this graph's nodes (a graph output, or by a subgraph).
    pub fn escapes(&self, value: &str) -> bool {
        self.escapes.contains(value)
    }

    pub fn initializer(&self, value: &str) -> Option<&'g TensorProto> {
        self.initializers.get(value).copied()
    }

    /// The tensor of a constant value: an initializer that is not also a graph input (which a
    /// runtime could override), or the output of a `Constant` node.
    pub fn constant(&self, value: &str) -> Option<TensorProto> {
        if let Some(t) = self.initializer(value) {
            let overridable = self.graph.input.iter().any(|i| i.name == value);
            return (!overridable).then(|| t.clone());
        }
        let node = self.node(self.producer(value)?);
        (node.op_type == "Constant" && node.domain.is_empty()).then(|| constant_node_value(node)).flatten()
    }

    /// A constant's elements as f64, if it is a numeric constant.
    pub fn constant_values(&self, value: &str) -> Result<Option<Vec<f64>>> {
        match self.constant(value) {
            Some(t) => constant::as_f64(&t, self.data_dir),
            None => Ok(None),
        }
    }

    pub fn constant_scalar(&self, value: &str) -> Result<Option<f64>> {
        Ok(self.constant_values(value)?.filter(|v| v.len() == 1).map(|v| v[0]))
    }

    /// The declared or constant type only.
    pub(crate) fn known_elem_type(&self, value: &str) -> Option<i32> {
        if let Some(t) = self.declared.get(value).and_then(|v| tensor_type(v)).map(|t| t.elem_type).filter(|&t| t != 0)
        {
            return Some(t);
        }
        self.constant(value).map(|t| t.data_type).filter(|&t| t != 0)
    }

    /// The declared shape (value_info, graph input/output, or the dims of a constant).
    pub(crate) fn declared_shape(&self, value: &str) -> Option<Vec<Dim>> {
        if let Some(t) = self.initializer(value) {
            return Some(t.dims.iter().map(|&d| Dim::Fixed(d)).collect());
        }
        if let Some(t) = self.declared.get(value).and_then(|v| tensor_type(v)) {
            let shape = t.shape.as_ref()?;
            return Some(
                shape
                    .dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(dimension::Value::DimValue(n)) => Dim::Fixed(*n),
                        Some(dimension::Value::DimParam(s)) if !s.is_empty() => Dim::Named(s.clone()),
                        _ => Dim::Unknown,
                    })
                    .collect(),
            );
        }
        self.constant(value).map(|t| t.dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }
}

fn tensor_type(v: &ValueInfoProto) -> Option<&type_proto::Tensor> {
    match &v.type_.as_ref()?.value {
        Some(type_proto::Value::TensorType(t)) => Some(t),
        _ => None,
    }
}

/// Standard ONNX op `op` (default domain).
pub fn is_op(node: &NodeProto, op: &str) -> bool {
    node.op_type == op && (node.domain.is_empty() || node.domain == "ai.onnx")
}

/// A node's first output ("" when it has none: no value is named "", so nothing reads it).
pub fn out0(node: &NodeProto) -> &str {
    node.output.first().map(String::as_str).unwrap_or("")
}

/// A node's first input ("" when it has none).
pub fn in0(node: &NodeProto) -> &str {
    node.input.first().map(String::as_str).unwrap_or("")
}

pub fn attr<'n>(node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

pub fn int_attr(node: &NodeProto, name: &str) -> Option<i64> {
    attr(node, name).filter(|a| a.type_.value() == AttributeType::INT as i32).map(|a| a.i)
}

pub fn ints_attr(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(node, name).filter(|a| a.type_.value() == AttributeType::INTS as i32).map(|a| a.ints.clone())
}

pub fn float_attr(node: &NodeProto, name: &str) -> Option<f32> {
    attr(node, name).filter(|a| a.type_.value() == AttributeType::FLOAT as i32).map(|a| a.f)
}

/// The tensor a `Constant` node produces, for its numeric forms.
fn constant_node_value(node: &NodeProto) -> Option<TensorProto> {
    let a = node.attribute.first()?;
    let t = |data_type: i32, dims: Vec<i64>| TensorProto { data_type, dims, ..Default::default() };
    match a.name.as_str() {
        "value" => a.t.as_ref().cloned(),
        "value_float" => Some(TensorProto { float_data: vec![a.f], ..t(dtype::FLOAT, vec![]) }),
        "value_floats" => {
            Some(TensorProto { float_data: a.floats.clone(), ..t(dtype::FLOAT, vec![a.floats.len() as i64]) })
        }
        "value_int" => Some(TensorProto { int64_data: vec![a.i], ..t(dtype::INT64, vec![]) }),
        "value_ints" => Some(TensorProto { int64_data: a.ints.clone(), ..t(dtype::INT64, vec![a.ints.len() as i64]) }),
        _ => None,
    }
}

/// The subgraphs a node carries (If branches, Loop/Scan bodies).
pub fn subgraphs(node: &NodeProto) -> impl Iterator<Item = &GraphProto> {
    node.attribute.iter().flat_map(|a| a.g.as_ref().into_iter().chain(a.graphs.iter()))
}

/// Names a subgraph reads that it does not define itself (values of enclosing scopes).
pub fn outer_names<'g>(sub: &'g GraphProto, into: &mut HashSet<&'g str>) {
    let mut defined: HashSet<&str> = sub.input.iter().map(|v| v.name.as_str()).collect();
    defined.extend(sub.initializer.iter().map(|t| t.name.as_str()));
    for node in &sub.node {
        for input in node.input.iter().filter(|v| !v.is_empty()) {
            if !defined.contains(input.as_str()) {
                into.insert(input);
            }
        }
        for inner in subgraphs(node) {
            let mut names = HashSet::new();
            outer_names(inner, &mut names);
            into.extend(names.into_iter().filter(|n| !defined.contains(n)));
        }
        defined.extend(node.output.iter().map(String::as_str));
    }
    into.extend(sub.output.iter().map(|o| o.name.as_str()).filter(|n| !defined.contains(n)));
}
