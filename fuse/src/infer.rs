//! Element types and shapes of values the graph does not declare (a model without `value_info`;
//! ONNX's own shape inference stops at custom ops such as `AllReducePlugin`), from their
//! producers, over the standard ops that all-reduce chains and the projections before them are
//! made of. Only what the ops' definitions fix is inferred: an op not listed here, or an input
//! that cannot be known, gives nothing (None, or `Dim::Unknown` for one dimension).
//!
//! The layer above `graph`: the index keeps what the graph declares (and this layer's answers,
//! memoised), and `Infer` adds `elem_type` and `shape` to it, so the index needs nothing from
//! here and the matchers above (`layout`, `norm`, `chain`) ask through the trait.

use crate::dtype;
use crate::graph::{int_attr, ints_attr, is_op, same_dim, Dim, GraphIndex};
use crate::proto::NodeProto;

/// The op type of edgellm-allreduce's plugin. It lives here, the lowest layer that needs it: a
/// plain all-reduce is a custom op ONNX's own inference stops at, so its rule is ours.
pub const PLUGIN_OP: &str = "AllReducePlugin";

/// What is known of a value's element type and shape: declared, else inferred from producers.
/// A trait (implemented for `GraphIndex` only) so that the rules stay above the index.
pub trait Infer {
    /// The element type: declared (value_info, graph input/output), of a constant, else inferred
    /// from the producer.
    fn elem_type(&self, value: &str) -> Option<i32>;

    /// The shape: declared, else inferred from the producer; dimensions the inference cannot
    /// name are `Dim::Unknown`.
    fn shape(&self, value: &str) -> Option<Vec<Dim>>;
}

impl Infer for GraphIndex<'_> {
    fn elem_type(&self, value: &str) -> Option<i32> {
        elem_type_within(self, value, INFER_DEPTH)
    }

    fn shape(&self, value: &str) -> Option<Vec<Dim>> {
        shape_within(self, value, INFER_DEPTH)
    }
}

/// How many producers back the inference looks (a bound, also against malformed cyclic graphs).
const INFER_DEPTH: u32 = 512;

fn elem_type_within(g: &GraphIndex, value: &str, depth: u32) -> Option<i32> {
    if let Some(t) = g.known_elem_type(value) {
        return Some(t);
    }
    if let Some(&cached) = g.inferred_types.borrow().get(value) {
        return cached;
    }
    let t = if depth == 0 { None } else { elem_type_from_producer(g, value, depth - 1) };
    if depth > 0 {
        g.inferred_types.borrow_mut().insert(value.to_owned(), t);
    }
    t
}

fn shape_within(g: &GraphIndex, value: &str, depth: u32) -> Option<Vec<Dim>> {
    if let Some(s) = g.declared_shape(value) {
        return Some(s);
    }
    if let Some(cached) = g.inferred_shapes.borrow().get(value) {
        return cached.clone();
    }
    let s = if depth == 0 { None } else { shape_from_producer(g, value, depth - 1) };
    if depth > 0 {
        g.inferred_shapes.borrow_mut().insert(value.to_owned(), s.clone());
    }
    s
}

/// Ops whose output has the type of every one of their inputs (ONNX's homogeneous `T`).
const SAME_TYPE_ALL_INPUTS: [&str; 10] = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "MatMul", "Gemm"];

/// Ops whose output has the type of their first input.
const SAME_TYPE_FIRST_INPUT: [&str; 32] = [
    "Pow",
    "Neg",
    "Abs",
    "Sqrt",
    "Reciprocal",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Erf",
    "Softmax",
    "Identity",
    "Reshape",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Transpose",
    "Expand",
    "Slice",
    "Gather",
    "Split",
    "Tile",
    "Pad",
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "LayerNormalization",
    "Dropout",
    "Clip",
    "Gelu",
    "Concat",
];

/// Ops whose output has the shape of their first input.
const SAME_SHAPE: [&str; 20] = [
    "Cast",
    "CastLike",
    "Identity",
    "Neg",
    "Abs",
    "Sqrt",
    "Reciprocal",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Erf",
    "Softmax",
    "Dropout",
    "Clip",
    "Gelu",
    "LayerNormalization",
    "RMSNormalization",
    "DequantizeLinear",
];

/// Element-wise ops with multidirectional broadcasting.
const BROADCAST: [&str; 9] = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Where"];

/// A plain (unfused, one input, one output) all-reduce: element-wise, type and shape of its input.
fn is_plain_all_reduce(node: &NodeProto) -> bool {
    node.op_type == PLUGIN_OP && node.input.len() == 1 && node.output.len() == 1
}

/// The node producing `value` as its first output (the only output these rules describe).
fn producer_of<'g>(g: &GraphIndex<'g>, value: &str) -> Option<&'g NodeProto> {
    let node = g.node(g.producer(value)?);
    (node.output.first().map(String::as_str) == Some(value)).then_some(node)
}

fn elem_type_from_producer(g: &GraphIndex, value: &str, depth: u32) -> Option<i32> {
    let node = producer_of(g, value)?;
    let of = |i: usize| node.input.get(i).filter(|s| !s.is_empty()).and_then(|s| elem_type_within(g, s, depth));
    // Rsqrt is no standard op (the norm matcher takes it from any domain): same type as its input.
    if is_plain_all_reduce(node) || node.op_type == "Rsqrt" {
        return of(0);
    }
    let op = |name: &str| is_op(node, name);
    if op("Cast") {
        return int_attr(node, "to").map(|t| t as i32).filter(|&t| t != 0);
    }
    if op("CastLike") {
        return of(1);
    }
    if op("Shape") || op("Size") {
        return Some(dtype::INT64);
    }
    if op("RMSNormalization") {
        return of(1); // Y has the scale's type V
    }
    if op("DequantizeLinear") {
        // Opset 21+: output_dtype, else the scale's type.
        return int_attr(node, "output_dtype").map(|t| t as i32).filter(|&t| t != 0).or_else(|| of(1));
    }
    if op("Where") {
        return [1, 2]
            .iter()
            .find_map(|&i| node.input.get(i).and_then(|s| g.known_elem_type(s)))
            .or_else(|| of(1))
            .or_else(|| of(2));
    }
    if SAME_TYPE_ALL_INPUTS.iter().any(|o| op(o)) {
        // Any input tells: declared or constant ones first (no search), then by inference.
        let inputs = || node.input.iter().filter(|s| !s.is_empty());
        return inputs()
            .find_map(|s| g.known_elem_type(s))
            .or_else(|| inputs().find_map(|s| elem_type_within(g, s, depth)));
    }
    if SAME_TYPE_FIRST_INPUT.iter().any(|o| op(o)) {
        return of(0);
    }
    None
}

fn shape_from_producer(g: &GraphIndex, value: &str, depth: u32) -> Option<Vec<Dim>> {
    let node = producer_of(g, value)?;
    let of = |i: usize| node.input.get(i).filter(|s| !s.is_empty()).and_then(|s| shape_within(g, s, depth));
    let op = |name: &str| is_op(node, name);
    if is_plain_all_reduce(node) || node.op_type == "Rsqrt" || SAME_SHAPE.iter().any(|o| op(o)) {
        return of(0);
    }
    if BROADCAST.iter().any(|o| op(o)) {
        let shapes: Option<Vec<Vec<Dim>>> = node.input.iter().map(|s| shape_within(g, s, depth)).collect();
        return broadcast(&shapes?);
    }
    if op("Reshape") {
        return reshape(g, node, of(0).as_deref());
    }
    if op("Squeeze") || op("Unsqueeze") {
        let input = of(0)?;
        let axes = match node.input.get(1).filter(|s| !s.is_empty()) {
            Some(a) => Some(g.constant_values(a).ok()??.into_iter().map(|v| v as i64).collect::<Vec<_>>()),
            None => ints_attr(node, "axes"),
        };
        return if op("Squeeze") { squeeze(&input, axes.as_deref()) } else { unsqueeze(&input, &axes?) };
    }
    if op("ReduceMean") || op("ReduceSum") || op("ReduceMax") {
        let input = of(0)?;
        let axes = match node.input.get(1).filter(|s| !s.is_empty()) {
            Some(a) => g.constant_values(a).ok()??.into_iter().map(|v| v as i64).collect::<Vec<_>>(),
            None => ints_attr(node, "axes")?,
        };
        let axes: Option<Vec<usize>> = axes.iter().map(|&a| normalise(a, input.len())).collect();
        let axes = axes?;
        if axes.is_empty() || int_attr(node, "keepdims") == Some(0) {
            return None; // all axes (noop_with_empty_axes aside), or dropped: not needed here
        }
        return Some(
            input.iter().enumerate().map(|(i, d)| if axes.contains(&i) { Dim::Fixed(1) } else { d.clone() }).collect(),
        );
    }
    if op("Flatten") {
        let input = of(0)?;
        let axis = normalise(int_attr(node, "axis").unwrap_or(1), input.len() + 1)?;
        let side = |dims: &[Dim]| match dims {
            [one] => one.clone(),
            _ => fixed_product(dims).map(Dim::Fixed).unwrap_or(Dim::Unknown),
        };
        return Some(vec![side(&input[..axis]), side(&input[axis..])]);
    }
    if op("MatMul") {
        let (a, b) = (of(0)?, of(1)?);
        if a.len() < 2 || b.len() < 2 {
            return None;
        }
        let mut batch = broadcast(&[a[..a.len() - 2].to_vec(), b[..b.len() - 2].to_vec()])?;
        batch.extend([a[a.len() - 2].clone(), b[b.len() - 1].clone()]);
        return Some(batch);
    }
    if op("Gemm") {
        // 2-D: rows of A (transA) by columns of B (transB); an unknown A still has rank 2.
        let pick = |s: Option<Vec<Dim>>, transposed: bool, rows: bool| {
            s.filter(|s| s.len() == 2).map(|s| s[usize::from(transposed == rows)].clone()).unwrap_or(Dim::Unknown)
        };
        let ta = int_attr(node, "transA").unwrap_or(0) != 0;
        let tb = int_attr(node, "transB").unwrap_or(0) != 0;
        return Some(vec![pick(of(0), ta, true), pick(of(1), tb, false)]);
    }
    None
}

/// An axis of a tensor of `rank` as a non-negative index.
fn normalise(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a).ok().filter(|&a| a < rank)
}

/// ONNX's multidirectional broadcast of known-rank shapes: a dimension is known where the
/// inputs fix it (a fixed size other than 1 wins; equal names stay), else unknown.
pub(crate) fn broadcast(shapes: &[Vec<Dim>]) -> Option<Vec<Dim>> {
    let rank = shapes.iter().map(Vec::len).max()?;
    let dims = (0..rank).map(|k| {
        let at: Vec<&Dim> = shapes.iter().filter_map(|s| (k + s.len()).checked_sub(rank).map(|i| &s[i])).collect();
        if let Some(n) = at.iter().find_map(|d| matches!(d, Dim::Fixed(n) if *n != 1).then_some(*d)) {
            return n.clone();
        }
        if at.iter().all(|d| **d == Dim::Fixed(1)) {
            return Dim::Fixed(1);
        }
        let non_one: Vec<&&Dim> = at.iter().filter(|d| ***d != Dim::Fixed(1)).collect();
        match non_one.first() {
            Some(Dim::Named(n)) if non_one.iter().all(|d| matches!(d, Dim::Named(m) if m == n)) => {
                // A named dimension broadcast with 1s is itself (it may be 1 too: then all are).
                Dim::Named(n.clone())
            }
            _ => Dim::Unknown,
        }
    });
    Some(dims.collect())
}

fn reshape(g: &GraphIndex, node: &NodeProto, input: Option<&[Dim]>) -> Option<Vec<Dim>> {
    let target: Vec<i64> =
        g.constant_values(node.input.get(1)?).ok()??.into_iter().map(|v| v as i64).collect::<Vec<_>>();
    let allow_zero = int_attr(node, "allowzero").unwrap_or(0) != 0;
    let copied = |i: usize| input.and_then(|s| s.get(i)).cloned().unwrap_or(Dim::Unknown);
    let mut out: Vec<Dim> = target
        .iter()
        .enumerate()
        .map(|(i, &t)| match t {
            0 if !allow_zero => copied(i),
            t if t >= 0 => Dim::Fixed(t),
            _ => Dim::Unknown,
        })
        .collect();
    if let Some(free) = target.iter().position(|&t| t == -1) {
        out[free] = infer_free_dim(input, &out, free);
    }
    Some(out)
}

/// The size Reshape gives its `-1` entry: the input's dimension at the same place when every
/// other dimension provably equals the input's (same rank: what is left over is that one), or
/// the quotient of the element counts when all of them are fixed.
fn infer_free_dim(input: Option<&[Dim]>, out: &[Dim], free: usize) -> Dim {
    let Some(input) = input else { return Dim::Unknown };
    if input.len() == out.len() && (0..out.len()).all(|i| i == free || same_dim(&input[i], &out[i])) {
        return input[free].clone();
    }
    let rest: Vec<Dim> = out.iter().enumerate().filter(|(i, _)| *i != free).map(|(_, d)| d.clone()).collect();
    match (fixed_product(input), fixed_product(&rest)) {
        (Some(total), Some(rest)) if rest > 0 && total % rest == 0 => Dim::Fixed(total / rest),
        _ => Dim::Unknown,
    }
}

/// The element count of dimensions of known sizes.
fn fixed_product(dims: &[Dim]) -> Option<i64> {
    dims.iter().try_fold(1i64, |n, d| match d {
        Dim::Fixed(k) => n.checked_mul(*k),
        _ => None,
    })
}

fn squeeze(input: &[Dim], axes: Option<&[i64]>) -> Option<Vec<Dim>> {
    match axes {
        Some(axes) => {
            let axes: Option<Vec<usize>> = axes.iter().map(|&a| normalise(a, input.len())).collect();
            let axes = axes?;
            Some(input.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d.clone()).collect())
        }
        // Without axes every 1 goes: only a shape of known sizes says which.
        None => input
            .iter()
            .all(|d| matches!(d, Dim::Fixed(_)))
            .then(|| input.iter().filter(|d| **d != Dim::Fixed(1)).cloned().collect()),
    }
}

fn unsqueeze(input: &[Dim], axes: &[i64]) -> Option<Vec<Dim>> {
    let rank = input.len() + axes.len();
    let axes: Option<Vec<usize>> = axes.iter().map(|&a| normalise(a, rank)).collect();
    let axes = axes?;
    let mut rest = input.iter();
    (0..rank).map(|i| if axes.contains(&i) { Some(Dim::Fixed(1)) } else { rest.next().cloned() }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(n: i64) -> Dim {
        Dim::Fixed(n)
    }

    fn named(s: &str) -> Dim {
        Dim::Named(s.into())
    }

    #[test]
    fn broadcast_keeps_what_the_inputs_fix() {
        let t = named("tokens");
        assert_eq!(broadcast(&[vec![t.clone(), f(64)], vec![t.clone(), f(64)]]), Some(vec![t.clone(), f(64)]));
        assert_eq!(broadcast(&[vec![Dim::Unknown, f(64)], vec![f(64)]]), Some(vec![Dim::Unknown, f(64)]));
        assert_eq!(broadcast(&[vec![Dim::Unknown, f(1)], vec![t.clone(), f(64)]]), Some(vec![Dim::Unknown, f(64)]));
        assert_eq!(broadcast(&[vec![], vec![t.clone(), f(1)]]), Some(vec![t, f(1)]));
    }

    #[test]
    fn reshape_free_dim() {
        let t = named("tokens");
        // [-1, 64] of [tokens, 64]: the same shape.
        assert_eq!(infer_free_dim(Some(&[t.clone(), f(64)]), &[Dim::Unknown, f(64)], 0), t);
        assert_eq!(infer_free_dim(Some(&[Dim::Unknown, f(64)]), &[Dim::Unknown, f(64)], 0), Dim::Unknown);
        assert_eq!(infer_free_dim(Some(&[f(4), f(2), f(32)]), &[Dim::Unknown, f(64)], 0), f(4));
        assert_eq!(infer_free_dim(Some(&[t, f(2), f(32)]), &[Dim::Unknown, f(64)], 0), Dim::Unknown);
    }

    #[test]
    fn squeeze_and_unsqueeze() {
        let t = named("tokens");
        assert_eq!(squeeze(&[t.clone(), f(1), f(64)], Some(&[1])), Some(vec![t.clone(), f(64)]));
        assert_eq!(squeeze(&[t.clone(), f(1), f(64)], None), None, "which dims are 1 is not known");
        assert_eq!(unsqueeze(&[t.clone(), f(64)], &[1]), Some(vec![t.clone(), f(1), f(64)]));
        assert_eq!(unsqueeze(&[t.clone(), f(64)], &[-1]), Some(vec![t, f(64), f(1)]));
    }
}
