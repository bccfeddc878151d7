//! Layout ops the pass looks through between the residual sum and the norm that reads it.
//!
//! The rule: a `Reshape`, `Flatten`, `Squeeze` or `Unsqueeze` is followed when the last
//! dimension of its input and of its output are provably the same size (the same fixed size,
//! or the same symbolic name, from `value_info` or inferred). These ops never move elements
//! (row-major order is kept), so with the last dimension kept every row of `hidden` elements
//! stays one row, in order: the norm over the last axis commutes with the op, and
//! `layout(norm(sum)) == norm(layout(sum))`. `Identity` is always followed, and so is a `Cast`
//! to a type that holds every value of the sum's type exactly followed by a `Cast` back (fp16 or
//! bf16 through fp32 or fp64, fp32 through fp64), which gives back the same values.
//!
//! The ops stay in the graph, reading the fused node's `residual_out` (the sum, as before), so
//! everything else that reads their outputs (the next residual `Add`) reads the same values.
//! When they provably keep the whole shape (identity), the fused node's normed output replaces
//! the norm's output directly; otherwise a copy of them turns the fused node's normed output
//! into the shape the norm's readers expect.

use crate::dtype;
use crate::graph::{int_attr, is_op, out0, same_dim, shape_text, Dim, GraphIndex};
use crate::infer::Infer;

/// One followed step: the nodes (kept in the graph), the value they end in, and whether they
/// provably keep the whole shape.
#[derive(Clone, Debug)]
pub struct Step {
    pub nodes: Vec<usize>,
    pub out: String,
    pub identity: bool,
}

const RESHAPING: [&str; 4] = ["Reshape", "Flatten", "Squeeze", "Unsqueeze"];

/// Whether the cast `from -> via -> from` gives back every value unchanged.
pub fn cast_pair_cancels(from: i32, via: i32) -> bool {
    match from {
        dtype::FLOAT16 | dtype::BFLOAT16 => matches!(via, dtype::FLOAT | dtype::DOUBLE) || via == from,
        dtype::FLOAT => matches!(via, dtype::DOUBLE | dtype::FLOAT),
        _ => false,
    }
}

/// Both shapes known, of one rank, every dimension provably equal.
fn same_shape(a: &[Dim], b: &[Dim]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_dim(x, y))
}

/// A Reshape to a constant shape that provably gives back its input's shape: the same rank,
/// every entry the input's size there (a fixed size equal to it, or 0 copying it), but for at
/// most one -1, which then is the input's size there too.
fn reshape_keeps_shape(g: &GraphIndex, node: usize, input: &[Dim]) -> bool {
    let node = g.node(node);
    let Some(target) = node.input.get(1).and_then(|s| g.constant_values(s).ok().flatten()) else {
        return false;
    };
    let allow_zero = int_attr(node, "allowzero").unwrap_or(0) != 0;
    target.len() == input.len()
        && target.iter().filter(|&&t| t == -1.0).count() <= 1
        && target
            .iter()
            .zip(input)
            .all(|(&t, d)| t == -1.0 || (t == 0.0 && !allow_zero) || (t > 0.0 && same_dim(&Dim::Fixed(t as i64), d)))
}

/// The step node `c` makes from `value` (of type `elem`), if it is a layout op reading it: Ok
/// when it may be followed, Err(reason) when it is a layout op that does not keep the rows.
pub fn step(g: &GraphIndex, c: usize, value: &str, elem: i32) -> Option<Result<Step, String>> {
    let node = g.node(c);
    if node.input.first().map(String::as_str) != Some(value) || node.output.len() != 1 {
        return None;
    }
    if is_op(node, "Identity") {
        return Some(Ok(Step { nodes: vec![c], out: out0(node).to_owned(), identity: true }));
    }
    if is_op(node, "Cast") {
        let via = int_attr(node, "to")? as i32;
        if !cast_pair_cancels(elem, via) {
            return None;
        }
        let back = g.consumers(out0(node)).iter().copied().find(|&b| {
            let n = g.node(b);
            is_op(n, "Cast") && int_attr(n, "to") == Some(elem as i64) && n.output.len() == 1
        })?;
        return Some(Ok(Step { nodes: vec![c, back], out: out0(g.node(back)).to_owned(), identity: true }));
    }
    if !RESHAPING.iter().any(|op| is_op(node, op)) {
        return None;
    }
    let label = format!("{} '{}'", node.op_type, node.name);
    let out = out0(node);
    let (Some(a), Some(b)) = (g.shape(value), g.shape(out)) else {
        return Some(Err(format!(
            "{label} reads the residual sum '{value}', and the shapes around it are not known (the last \
             dimension must provably stay the hidden size)"
        )));
    };
    let keeps_rows = matches!((a.last(), b.last()), (Some(x), Some(y)) if same_dim(x, y));
    if !keeps_rows {
        return Some(Err(format!(
            "{label} turns the residual sum '{value}' {} into {}: the last (hidden) dimension does not provably \
             stay the same",
            shape_text(&a),
            shape_text(&b)
        )));
    }
    let identity = same_shape(&a, &b) || (is_op(node, "Reshape") && reshape_keeps_shape(g, c, &a));
    Some(Ok(Step { nodes: vec![c], out: out.to_owned(), identity }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cast_pairs_that_cancel() {
        assert!(cast_pair_cancels(dtype::FLOAT16, dtype::FLOAT));
        assert!(cast_pair_cancels(dtype::BFLOAT16, dtype::FLOAT));
        assert!(cast_pair_cancels(dtype::BFLOAT16, dtype::DOUBLE));
        assert!(cast_pair_cancels(dtype::FLOAT, dtype::DOUBLE));
        assert!(!cast_pair_cancels(dtype::FLOAT, dtype::FLOAT16), "fp32 through fp16 rounds");
        assert!(!cast_pair_cancels(dtype::FLOAT16, dtype::BFLOAT16), "fp16 through bf16 rounds");
        assert!(!cast_pair_cancels(dtype::BFLOAT16, dtype::FLOAT16), "bf16 through fp16 overflows");
        assert!(!cast_pair_cancels(dtype::FLOAT16, dtype::INT32));
    }
}
