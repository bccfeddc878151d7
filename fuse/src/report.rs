//! What the pass did with each candidate all-reduce, one line each.

use std::fmt;

// One per AllReducePlugin node, never held in bulk: the fused variant's size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Fused {
        x: String,
        /// Layout ops moved from after the all-reduce to before the fused node (they reshape x).
        moved: Vec<String>,
        residual: String,
        gamma: String,
        /// The weight converted into `gamma` (another float type), if any.
        gamma_from: Option<String>,
        bias: Option<String>,
        eps: f32,
        normed: String,
        residual_out: String,
        dtype: String,
        form: String,
        /// Layout ops between the residual sum and the norm, which stay (see `layout`).
        norm_through: Vec<String>,
        /// Whether they change the shape: a copy of them makes `normed` from the fused output.
        relayout: bool,
    },
    Left(String),
    /// Matched, but not among `--only`.
    NotSelected,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// 1-based, in graph order: what `--only` selects.
    pub number: usize,
    pub node: String,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub candidates: Vec<Candidate>,
}

impl Report {
    pub fn fused(&self) -> usize {
        self.candidates.iter().filter(|c| matches!(c.outcome, Outcome::Fused { .. })).count()
    }
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let n = self.number;
        let node = &self.node;
        match &self.outcome {
            Outcome::Fused {
                x,
                moved,
                residual,
                gamma,
                gamma_from,
                bias,
                eps,
                normed,
                residual_out,
                dtype,
                form,
                norm_through,
                relayout,
            } => {
                let gamma = match gamma_from {
                    Some(from) => format!("{gamma} (new, {dtype} copy of '{from}')"),
                    None => gamma.clone(),
                };
                let bias = bias.as_deref().map(|b| format!(", bias={b}")).unwrap_or_default();
                let moved = if moved.is_empty() {
                    String::new()
                } else {
                    format!(" (through {}, moved before the node)", moved.join(", "))
                };
                let through = match (norm_through.is_empty(), relayout) {
                    (true, _) => String::new(),
                    (false, false) => format!(" (norm read through {}, kept)", norm_through.join(", ")),
                    (false, true) => {
                        format!(
                            " (norm read through {}, kept and copied after the normed output)",
                            norm_through.join(", ")
                        )
                    }
                };
                write!(
                    f,
                    "#{n} fused '{node}' [{dtype}; {form}]: x={x}{moved}, residual={residual}, gamma={gamma}{bias}, eps={eps:e} \
                     -> normed={normed}{through}, residual_out={residual_out}"
                )
            }
            Outcome::Left(reason) => write!(f, "#{n} left  '{node}': {reason}"),
            Outcome::NotSelected => write!(f, "#{n} left  '{node}': fusible, but not selected by --only"),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        for c in &self.candidates {
            writeln!(f, "{c}")?;
        }
        write!(f, "fused {} of {} AllReducePlugin nodes", self.fused(), self.candidates.len())
    }
}
