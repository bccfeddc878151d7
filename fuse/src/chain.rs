//! Finds `AllReducePlugin -> [bias Add] -> residual Add -> RMSNorm` chains: the all-reduce of a
//! row-parallel projection, its optional bias, the residual connection and the norm that reads it.

use crate::dtype;
use crate::graph::{int_attr, is_op, out0, shape_text, Dim, GraphIndex};
use crate::infer::{Infer, PLUGIN_OP};
use crate::norm::{match_norm, other_input, refuse, Matched, NormMatch, Sum};

/// Ops that only change how a tensor's elements are laid out in dimensions.
const LAYOUT_OPS: [&str; 5] = ["Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"];

/// A chain the fused node can replace.
#[derive(Clone, Debug)]
pub struct Chain {
    pub all_reduce: usize,
    pub x: String,
    /// Layout ops (Reshape, ...) between the all-reduce and the residual Add, in order: they
    /// stay, moved before the fused node (the first now reads `x`).
    pub hoisted: Vec<usize>,
    /// The fused node's x: `x`, or the last hoisted op's output.
    pub fused_x: String,
    pub bias: Option<String>,
    pub residual: String,
    /// The residual sum (the fused node's second output, `residual_out`).
    pub sum: String,
    pub elem: i32,
    pub norm: NormMatch,
    /// Every node the fused node replaces: all-reduce, Adds, norm (not the hoisted ones).
    pub nodes: Vec<usize>,
}

/// An all-reduce that did not already fuse something: every `AllReducePlugin` node is a
/// candidate, in graph order.
pub fn is_candidate(g: &GraphIndex, i: usize) -> bool {
    g.node(i).op_type == PLUGIN_OP
}

/// Whether a node already runs the fused op (either spelling of the plugin's fields).
fn already_fused(g: &GraphIndex, i: usize) -> bool {
    let node = g.node(i);
    int_attr(node, "fusion_op").is_some_and(|f| f != 0) || int_attr(node, "config").is_some_and(|c| c & 2 != 0)
}

fn shapes_agree(a: &[Dim], b: &[Dim]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.compatible(y))
}

pub fn match_chain(g: &GraphIndex, ar: usize) -> Matched<Chain> {
    let node = g.node(ar);
    if already_fused(g, ar) {
        return refuse(0, "already fused (fusion_op or config bit 2 set)");
    }
    let [x] = node.input.as_slice() else {
        return refuse(0, format!("has {} inputs, a plain all-reduce has 1", node.input.len()));
    };
    let [ar_out] = node.output.as_slice() else {
        return refuse(0, format!("has {} outputs, a plain all-reduce has 1", node.output.len()));
    };
    // The type: declared or inferred from x's producers here, else (below) from the residual,
    // which the Add's operands share.
    let x_elem = g.elem_type(x).or_else(|| g.elem_type(ar_out));
    if let Some(t) = x_elem.filter(|&t| !dtype::plugin_supports(t)) {
        return refuse(0, format!("its input is {}; the fused op takes fp32, fp16 or bf16", dtype::name(t)));
    }
    let mut nodes = vec![ar];

    // The all-reduced value goes only into the chain (the fused node does not output it),
    // through layout ops, an optional bias Add, to the residual Add.
    let sole_reader = |value: &str, what: &str, progress: usize| -> Matched<usize> {
        if g.escapes(value) {
            return refuse(progress, format!("{what} '{value}' is also a graph output or read by a subgraph"));
        }
        match g.consumers(value) {
            [c] => Ok(*c),
            [] => refuse(progress, format!("{what} '{value}' has no consumer")),
            many => refuse(
                progress,
                format!("{what} '{value}' has {} consumers (the fused node would hide it from the others)", many.len()),
            ),
        }
    };
    let mut h = ar_out.clone();
    let mut hoisted = Vec::new();
    let mut bias: Option<String> = None;
    let (add, residual) = loop {
        let progress = nodes.len() + hoisted.len();
        let what = if bias.is_some() { "the all-reduced value + bias" } else { "the all-reduced value" };
        let c = sole_reader(&h, what, progress)?;
        let node = g.node(c);
        if LAYOUT_OPS.iter().any(|op| is_op(node, op)) && node.input.first() == Some(&h) && hoisted.len() < 8 {
            hoisted.push(c);
            h = out0(node).to_owned();
            continue;
        }
        if !is_op(node, "Add") {
            return refuse(
                progress,
                format!("{what} '{h}' feeds {} '{}', not a residual Add", node.op_type, node.name),
            );
        }
        let Some(other) = other_input(node, &h).map(str::to_owned) else {
            return refuse(progress, format!("Add '{}' adds '{h}' to itself", node.name));
        };
        if bias.is_none() && is_bias(g, &other) {
            nodes.push(c);
            h = out0(node).to_owned();
            bias = Some(other);
            continue;
        }
        break (c, other);
    };
    // Layout ops commute with the all-reduce (an element-wise sum over ranks): they move before
    // the fused node and reshape x, which then has the residual's shape.
    let fused_x = hoisted.last().map(|&l| out0(g.node(l)).to_owned()).unwrap_or_else(|| x.clone());
    let x_shape = g.shape(&fused_x).or_else(|| if hoisted.is_empty() { g.shape(ar_out) } else { None });
    let r_elem = g.elem_type(&residual);
    let elem = match (x_elem, r_elem) {
        (Some(a), Some(r)) if a != r => {
            return refuse(
                2,
                format!("the residual '{residual}' is {}, the all-reduce {}", dtype::name(r), dtype::name(a)),
            );
        }
        (Some(t), _) => t,
        (None, Some(t)) if dtype::plugin_supports(t) => t,
        (None, Some(t)) => {
            return refuse(
                2,
                format!("the residual '{residual}' is {}; the fused op takes fp32, fp16 or bf16", dtype::name(t)),
            );
        }
        (None, None) => {
            return refuse(
                0,
                format!(
                    "the type of its input '{x}' is unknown (no value_info, and neither its producers nor the \
                     residual '{residual}' tell it)"
                ),
            );
        }
    };
    if let Some(b) = &bias {
        check_vector(g, b, elem, x_shape.as_deref(), "bias")?;
    }
    nodes.push(add);
    let sum = out0(g.node(add)).to_owned();
    let r_shape = g.shape(&residual);
    if let (Some(a), Some(b)) = (&x_shape, &r_shape) {
        if !shapes_agree(a, b) {
            return refuse(
                2,
                format!("the residual '{residual}' has shape {}, the all-reduce {}", shape_text(b), shape_text(a)),
            );
        }
    }
    let shape = x_shape.or(r_shape).or_else(|| g.shape(&sum));
    let norm = match_norm(g, &Sum { name: &sum, elem, shape }).map_err(|mut r| {
        r.progress += nodes.len();
        r
    })?;
    nodes.extend(&norm.nodes);
    Ok(Chain { all_reduce: ar, x: x.clone(), hoisted, fused_x, bias, residual, sum, elem, norm, nodes })
}

/// An operand added to the all-reduced value is its bias when it is a constant or a known 1-D
/// tensor (a residual has the activations' shape and is never a constant).
fn is_bias(g: &GraphIndex, value: &str) -> bool {
    g.constant(value).is_some() || g.shape(value).is_some_and(|s| s.len() == 1)
}

/// Checks a per-channel input of the plugin (bias): 1-D of the hidden size, of type `elem`.
fn check_vector(g: &GraphIndex, value: &str, elem: i32, x_shape: Option<&[Dim]>, what: &str) -> Matched<()> {
    let hidden = x_shape.and_then(|s| s.last());
    if let Some(shape) = g.shape(value) {
        if shape.len() != 1 || hidden.is_some_and(|h| !h.compatible(&shape[0])) {
            let want = hidden.map(|h| shape_text(std::slice::from_ref(h))).unwrap_or_else(|| "[hidden]".into());
            return refuse(
                1,
                format!("the {what} '{value}' has shape {}, the plugin needs 1-D {want}", shape_text(&shape)),
            );
        }
    }
    match g.elem_type(value) {
        Some(t) if t == elem => Ok(()),
        t => {
            let t = t.map(dtype::name).unwrap_or_else(|| "of unknown type".into());
            refuse(1, format!("the {what} '{value}' is {t}, the all-reduce {}", dtype::name(elem)))
        }
    }
}
