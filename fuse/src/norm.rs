//! Recognises the RMSNorm that reads a residual sum, in the forms exporters write:
//!
//! - primitive ops (Edge-LLM 0.11's `RMSNorm.forward` through torch's dynamo exporter):
//!   `[Cast to fp32] -> Pow 2 | Mul x x -> ReduceMean(last axis, keepdims) -> Add eps ->
//!   Rsqrt | Sqrt -> Reciprocal | Sqrt -> Div(1, .) -> Mul x` (or `Sqrt -> Div(x, .)`), then the
//!   weight: `Cast back -> Mul weight` or `Mul weight -> Cast back`, or `Mul weight` alone when
//!   the norm has no cast pair;
//! - ONNX's `RMSNormalization` (opset 23) over the last axis with an fp32 stash.
//!
//! The plugin computes `round((r * s) * gamma)` in fp32 with `r` the rounded residual sum and
//! `s = 1 / sqrt(mean(r^2) + eps)`, so every form above is the same arithmetic up to the
//! rounding of the intermediate cast back (weight after the cast) or of gamma (an fp32 weight
//! converted to the plugin's type): at most about one unit in the last place of the type.

use crate::proto::{NodeProto, TensorProto};

use crate::dtype;
use crate::graph::{float_attr, in0, int_attr, ints_attr, is_op, out0, shape_text, Dim, GraphIndex};
use crate::infer::Infer;

/// Why a chain was not fused, with how far matching got (the deepest attempt explains best).
#[derive(Clone, Debug)]
pub struct Refusal {
    pub progress: usize,
    pub reason: String,
}

pub type Matched<T> = std::result::Result<T, Refusal>;

pub fn refuse<T>(progress: usize, reason: impl Into<String>) -> Matched<T> {
    Err(Refusal { progress, reason: reason.into() })
}

/// Where the fused node's gamma comes from.
#[derive(Clone, Debug)]
pub enum Gamma {
    /// A value of the plugin's type, read as it is.
    Value(String),
    /// A constant of another float type: a new initializer of the plugin's type replaces it.
    Convert { from: String, tensor: Box<TensorProto> },
}

impl Gamma {
    pub fn source(&self) -> &str {
        match self {
            Gamma::Value(v) | Gamma::Convert { from: v, .. } => v,
        }
    }
}

#[derive(Clone, Debug)]
pub struct NormMatch {
    /// The norm's nodes (indices into the graph), all replaced by the fused node.
    pub nodes: Vec<usize>,
    pub eps: f32,
    pub gamma: Gamma,
    /// The normalised value (the fused node's first output).
    pub out: String,
    /// The form, for the report.
    pub form: String,
    /// Layout ops between the residual sum and the norm (see `layout`), in order: they stay.
    pub layout: Vec<usize>,
    /// Whether they change the shape, so that the fused node's normed output needs a copy of
    /// them to reach the norm's readers in the shape they read.
    pub relayout: bool,
}

/// What the norm must agree with: the residual sum's type, rank and hidden size.
pub struct Sum<'a> {
    pub name: &'a str,
    pub elem: i32,
    pub shape: Option<Vec<Dim>>,
}

impl Sum<'_> {
    fn hidden(&self) -> Option<&Dim> {
        self.shape.as_ref().and_then(|s| s.last())
    }
}

/// The other input of a two-input node that reads `value`, when exactly one input is `value`.
pub fn other_input<'n>(node: &'n NodeProto, value: &str) -> Option<&'n str> {
    match node.input.as_slice() {
        [a, b] if a == value && b != value => Some(b),
        [a, b] if b == value && a != value => Some(a),
        _ => None,
    }
}

/// How many layout steps the pass follows from the residual sum to the norm.
const MAX_LAYOUT_STEPS: usize = 4;

/// The RMSNorm reading the residual sum, directly or through layout ops (see `layout`).
pub fn match_norm(g: &GraphIndex, sum: &Sum) -> Matched<NormMatch> {
    through_layout(g, sum, sum.name, Vec::new(), true)
}

fn through_layout(g: &GraphIndex, sum: &Sum, value: &str, layout: Vec<usize>, identity: bool) -> Matched<NormMatch> {
    let shape = g.shape(value).or_else(|| if identity { sum.shape.clone() } else { None });
    let here = Sum { name: value, elem: sum.elem, shape };
    let mut best = match match_norm_at(g, &here) {
        Ok(m) => return Ok(NormMatch { layout, relayout: !identity, ..m }),
        Err(mut r) => {
            r.progress += layout.len();
            r
        }
    };
    if layout.len() >= MAX_LAYOUT_STEPS {
        return Err(best);
    }
    for &c in g.consumers(value) {
        let outcome = match crate::layout::step(g, c, value, sum.elem) {
            None => continue,
            Some(Err(reason)) => Err(Refusal { progress: layout.len() + 1, reason }),
            Some(Ok(step)) => {
                let mut deeper = layout.clone();
                deeper.extend(&step.nodes);
                through_layout(g, sum, &step.out, deeper, identity && step.identity)
            }
        };
        match outcome {
            Ok(m) => return Ok(m),
            Err(r) if r.progress > best.progress => best = r,
            Err(_) => {}
        }
    }
    Err(best)
}

fn match_norm_at(g: &GraphIndex, sum: &Sum) -> Matched<NormMatch> {
    let mut attempts = Vec::new();
    for &c in g.consumers(sum.name) {
        let node = g.node(c);
        if node.input.first().map(String::as_str) != Some(sum.name) {
            continue;
        }
        if is_op(node, "RMSNormalization") {
            attempts.push(rms_normalization(g, c, sum));
        } else if is_op(node, "Cast") {
            attempts.push(Primitive::new(g, sum).after_cast(c));
        }
    }
    if g.consumers(sum.name).iter().any(|&c| is_square(g, g.node(c), sum.name)) {
        attempts.push(Primitive::new(g, sum).squaring(sum.name, false));
    }
    let mut best: Option<Refusal> = None;
    for attempt in attempts {
        match attempt {
            Ok(m) => return Ok(m),
            Err(r) if best.as_ref().is_none_or(|b| r.progress > b.progress) => best = Some(r),
            Err(_) => {}
        }
    }
    Err(best.unwrap_or(Refusal { progress: 0, reason: format!("no RMSNorm reads the residual sum '{}'", sum.name) }))
}

fn is_square(g: &GraphIndex, node: &NodeProto, x: &str) -> bool {
    if is_op(node, "Mul") {
        return node.input.len() == 2 && node.input.iter().all(|i| i == x);
    }
    is_op(node, "Pow")
        && node.input.len() == 2
        && node.input[0] == x
        && matches!(g.constant_scalar(&node.input[1]), Ok(Some(p)) if p == 2.0)
}

/// Checks a weight against the hidden size and finds how the plugin gets it in type `elem`.
fn gamma(g: &GraphIndex, w: &str, sum: &Sum, progress: usize) -> Matched<Gamma> {
    if let Some(shape) = g.shape(w) {
        let fits = shape.len() == 1 && sum.hidden().is_none_or(|h| h.compatible(&shape[0]));
        if !fits {
            let hidden = sum.hidden().map(|h| shape_text(std::slice::from_ref(h))).unwrap_or_else(|| "?".into());
            return refuse(
                progress,
                format!("the norm weight '{w}' has shape {}, the plugin needs 1-D {hidden}", shape_text(&shape)),
            );
        }
    }
    match g.elem_type(w) {
        Some(t) if t == sum.elem => Ok(Gamma::Value(w.to_owned())),
        Some(t) if matches!(t, dtype::FLOAT | dtype::FLOAT16 | dtype::BFLOAT16 | dtype::DOUBLE) => {
            // An upcast of a weight of the plugin's type: read the original, exactly.
            if let Some(p) = g.producer(w).map(|p| g.node(p)).filter(|p| is_op(p, "Cast")) {
                if g.elem_type(in0(p)) == Some(sum.elem) {
                    return Ok(Gamma::Value(in0(p).to_owned()));
                }
            }
            match g.constant(w) {
                Some(tensor) => Ok(Gamma::Convert { from: w.to_owned(), tensor: Box::new(tensor) }),
                None => refuse(
                    progress,
                    format!(
                        "the norm weight '{w}' is {} and not a constant: the plugin needs it in {}",
                        dtype::name(t),
                        dtype::name(sum.elem)
                    ),
                ),
            }
        }
        Some(t) => refuse(progress, format!("the norm weight '{w}' is {}", dtype::name(t))),
        None => refuse(progress, format!("the type of the norm weight '{w}' is unknown")),
    }
}

fn check_eps(eps: f64, progress: usize) -> Matched<f32> {
    let e = eps as f32;
    if e.is_finite() && e >= 0.0 {
        Ok(e)
    } else {
        refuse(progress, format!("eps {eps} is not a finite number >= 0"))
    }
}

/// True when `axis` names the last of `rank` axes (unknown rank: only -1 is sure).
fn is_last_axis(axis: i64, rank: Option<usize>) -> bool {
    axis == -1 || rank.is_some_and(|r| axis == r as i64 - 1)
}

fn rms_normalization(g: &GraphIndex, i: usize, sum: &Sum) -> Matched<NormMatch> {
    let node = g.node(i);
    let rank = sum.shape.as_ref().map(Vec::len);
    let axis = int_attr(node, "axis").unwrap_or(-1);
    if !is_last_axis(axis, rank) {
        return refuse(2, format!("RMSNormalization '{}' normalises from axis {axis}, not the last axis", node.name));
    }
    let stash = int_attr(node, "stash_type").unwrap_or(1);
    if stash != dtype::FLOAT as i64 {
        return refuse(
            2,
            format!(
                "RMSNormalization '{}' computes in {} (stash_type), the plugin in fp32",
                node.name,
                dtype::name(stash as i32)
            ),
        );
    }
    let Some(scale) = node.input.get(1).filter(|s| !s.is_empty()) else {
        return refuse(2, format!("RMSNormalization '{}' has no scale input", node.name));
    };
    // Its output has the scale's type: the plugin's outputs have x's.
    match g.elem_type(scale) {
        Some(t) if t == sum.elem => {}
        t => {
            let t = t.map(dtype::name).unwrap_or_else(|| "of unknown type".into());
            return refuse(
                2,
                format!(
                    "RMSNormalization '{}' has a scale {t}, the residual sum is {}",
                    node.name,
                    dtype::name(sum.elem)
                ),
            );
        }
    }
    let eps = check_eps(float_attr(node, "epsilon").unwrap_or(1e-5) as f64, 2)?;
    Ok(NormMatch {
        nodes: vec![i],
        eps,
        gamma: gamma(g, scale, sum, 2)?,
        out: out0(node).to_owned(),
        form: "RMSNormalization".into(),
        layout: Vec::new(),
        relayout: false,
    })
}

/// The primitive-op form, matched step by step from the value the norm squares.
struct Primitive<'a, 'g> {
    g: &'a GraphIndex<'g>,
    sum: &'a Sum<'a>,
    nodes: Vec<usize>,
    form: Vec<&'static str>,
}

impl<'a, 'g> Primitive<'a, 'g> {
    fn new(g: &'a GraphIndex<'g>, sum: &'a Sum<'a>) -> Self {
        Primitive { g, sum, nodes: Vec::new(), form: Vec::new() }
    }

    fn progress(&self) -> usize {
        2 + self.nodes.len()
    }

    fn refuse<T>(&self, reason: impl Into<String>) -> Matched<T> {
        refuse(self.progress(), reason)
    }

    /// The only reader of `value` (which must not escape the graph's nodes either).
    fn sole_reader(&self, value: &str) -> Matched<usize> {
        if self.g.escapes(value) {
            return self.refuse(format!("'{value}' inside the norm is also a graph output or read by a subgraph"));
        }
        match self.g.consumers(value) {
            [c] => Ok(*c),
            [] => self.refuse(format!("'{value}' has no consumer")),
            many => self.refuse(format!("'{value}' inside the norm has {} consumers (another reads it)", many.len())),
        }
    }

    /// The only reader of `value`, which must be a standard op among `ops`.
    fn sole_consumer(&self, value: &str, ops: &[&str]) -> Matched<usize> {
        let c = self.sole_reader(value)?;
        let node = self.g.node(c);
        if ops.iter().any(|op| is_op(node, op)) {
            Ok(c)
        } else {
            self.refuse(format!("'{value}' feeds {} '{}', expected {}", node.op_type, node.name, ops.join(" or ")))
        }
    }

    /// The next piece of the norm after `value`, past layout ops that provably keep its whole
    /// shape (`Identity`, a Reshape/Flatten/Squeeze/Unsqueeze giving back the same shape, see
    /// `layout`), which go with the norm: the piece, and the value it reads.
    fn next_piece(&mut self, value: &str, ops: &[&str]) -> Matched<(usize, String)> {
        let value = self.past_layout(value)?;
        Ok((self.sole_consumer(&value, ops)?, value))
    }

    /// `value`, or the value shape-keeping layout ops that alone read it make of it (they join
    /// the norm's nodes).
    fn past_layout(&mut self, value: &str) -> Matched<String> {
        let mut value = value.to_owned();
        for _ in 0..MAX_LAYOUT_STEPS {
            let c = self.sole_reader(&value)?;
            // No type given: a cast inside the norm is one of its pieces, never skipped.
            match crate::layout::step(self.g, c, &value, 0) {
                Some(Ok(step)) if step.identity => {
                    self.nodes.extend(&step.nodes);
                    if !self.form.contains(&"layout ops inside") {
                        self.form.push("layout ops inside");
                    }
                    value = step.out;
                }
                _ => break,
            }
        }
        Ok(value)
    }

    fn after_cast(mut self, cast: usize) -> Matched<NormMatch> {
        let node = self.g.node(cast);
        let to = int_attr(node, "to").unwrap_or(0) as i32;
        if to != dtype::FLOAT {
            return refuse(1, format!("the residual sum is cast to {}, not fp32", dtype::name(to)));
        }
        self.nodes.push(cast);
        self.form.push("cast pair");
        let xf = out0(node).to_owned();
        self.squaring(&xf, true)
    }

    /// From `xf`, the value squared and normalised: the sum, or its fp32 cast (`cast_pair`).
    fn squaring(mut self, xf: &str, cast_pair: bool) -> Matched<NormMatch> {
        let g = self.g;
        let Some(square) = g.consumers(xf).iter().copied().find(|&c| is_square(g, g.node(c), xf)) else {
            return self.refuse(format!("nothing squares '{xf}' (Pow 2 or Mul x x)"));
        };
        self.nodes.push(square);
        let (mean, _) = self.next_piece(out0(g.node(square)), &["ReduceMean"])?;
        self.check_mean(mean)?;
        self.nodes.push(mean);
        let (eps_add, m) = self.next_piece(out0(g.node(mean)), &["Add"])?;
        let eps = self.eps(eps_add, &m)?;
        self.nodes.push(eps_add);
        let normalised = self.inverse_sqrt(out0(g.node(eps_add)), xf)?;
        // `xf` feeds only the square and the normalising Mul/Div (the sum itself may feed more).
        if cast_pair {
            let readers = g.consumers(xf);
            if g.escapes(xf) || readers.iter().any(|r| !self.nodes.contains(r)) {
                return self.refuse(format!("the fp32 copy '{xf}' of the residual sum is also read outside the norm"));
            }
        }
        let n = out0(g.node(normalised)).to_owned();
        let (gamma_value, out) = if !cast_pair {
            let (mul, n) = self.next_piece(&n, &["Mul"])?;
            self.form.push("no cast pair");
            (self.weight_of(mul, &n)?, mul)
        } else {
            let (next, n) = self.next_piece(&n, &["Cast", "Mul"])?;
            if is_op(g.node(next), "Cast") {
                self.cast_back(next)?;
                let (mul, nc) = self.next_piece(out0(g.node(next)), &["Mul"])?;
                self.form.push("weight after the cast");
                (self.weight_of(mul, &nc)?, mul)
            } else {
                let w = self.weight_of(next, &n)?;
                let (cast_back, _) = self.next_piece(out0(g.node(next)), &["Cast"])?;
                self.cast_back(cast_back)?;
                self.form.push("weight before the cast");
                (w, cast_back)
            }
        };
        let gamma = gamma(g, &gamma_value, self.sum, self.progress())?;
        Ok(NormMatch {
            nodes: self.nodes,
            eps,
            gamma,
            out: out0(g.node(out)).to_owned(),
            form: self.form.join(", "),
            layout: Vec::new(),
            relayout: false,
        })
    }

    fn check_mean(&self, mean: usize) -> Matched<()> {
        let node = self.g.node(mean);
        let axes = match node.input.get(1).filter(|a| !a.is_empty()) {
            Some(a) => match self.g.constant_values(a) {
                Ok(Some(v)) => Some(v.into_iter().map(|x| x as i64).collect::<Vec<_>>()),
                _ => return self.refuse(format!("ReduceMean '{}' has axes that are not a constant", node.name)),
            },
            None => ints_attr(node, "axes"),
        };
        let rank = self.sum.shape.as_ref().map(Vec::len);
        let last = matches!(axes.as_deref(), Some([a]) if is_last_axis(*a, rank));
        if !last {
            return self
                .refuse(format!("ReduceMean '{}' does not reduce the last axis alone (axes {axes:?})", node.name));
        }
        if int_attr(node, "keepdims") == Some(0) {
            return self.refuse(format!("ReduceMean '{}' drops the reduced axis (keepdims 0)", node.name));
        }
        Ok(())
    }

    fn eps(&self, add: usize, mean: &str) -> Matched<f32> {
        let node = self.g.node(add);
        let Some(other) = other_input(node, mean) else {
            return self.refuse(format!("Add '{}' after the mean is not mean + eps", node.name));
        };
        match self.g.constant_scalar(other) {
            Ok(Some(eps)) => check_eps(eps, self.progress()),
            _ => self.refuse(format!("eps '{other}' (Add '{}') is not a one-element constant", node.name)),
        }
    }

    /// Matches `1/sqrt(e)` applied to `xf`; returns the node whose output is the normalised value.
    fn inverse_sqrt(&mut self, e: &str, xf: &str) -> Matched<usize> {
        let g = self.g;
        let e = self.past_layout(e)?;
        let first = self.sole_reader(&e)?;
        let node = g.node(first);
        // Rsqrt is no standard ONNX op: accept it from any domain.
        let inverse = if node.op_type == "Rsqrt" {
            self.nodes.push(first);
            self.form.push("Rsqrt");
            out0(node).to_owned()
        } else if is_op(node, "Sqrt") {
            self.nodes.push(first);
            let (next, s) = self.next_piece(out0(node), &["Reciprocal", "Div"])?;
            let s = s.as_str();
            let node = g.node(next);
            if is_op(node, "Div") {
                if node.input.len() != 2 || node.input[1] != s {
                    return self.refuse(format!("Div '{}' does not divide by the square root", node.name));
                }
                self.nodes.push(next);
                if node.input[0] == xf {
                    self.form.push("Sqrt + Div");
                    return Ok(next);
                }
                if !matches!(g.constant_scalar(&node.input[0]), Ok(Some(one)) if one == 1.0) {
                    return self.refuse(format!(
                        "Div '{}' divides '{}', not 1 or the normalised value",
                        node.name, node.input[0]
                    ));
                }
                self.form.push("Sqrt + Div(1, .)");
            } else {
                self.nodes.push(next);
                self.form.push("Sqrt + Reciprocal");
            }
            out0(node).to_owned()
        } else {
            return self.refuse(format!("'{e}' feeds {} '{}', expected Sqrt or Rsqrt", node.op_type, node.name));
        };
        let (mul, inverse) = self.next_piece(&inverse, &["Mul"])?;
        if other_input(g.node(mul), &inverse) != Some(xf) {
            return self.refuse(format!("Mul '{}' does not scale the normalised value by 1/sqrt", g.node(mul).name));
        }
        self.nodes.push(mul);
        Ok(mul)
    }

    fn cast_back(&mut self, cast: usize) -> Matched<()> {
        let to = int_attr(self.g.node(cast), "to").unwrap_or(0) as i32;
        if to != self.sum.elem {
            return self.refuse(format!(
                "the norm casts back to {}, the residual sum is {}",
                dtype::name(to),
                dtype::name(self.sum.elem)
            ));
        }
        self.nodes.push(cast);
        Ok(())
    }

    /// The weight operand of Mul `mul` whose other operand is `value`.
    fn weight_of(&mut self, mul: usize, value: &str) -> Matched<String> {
        let node = self.g.node(mul);
        let Some(w) = other_input(node, value) else {
            return self.refuse(format!("Mul '{}' multiplies '{value}' by itself", node.name));
        };
        self.nodes.push(mul);
        Ok(w.to_owned())
    }
}
