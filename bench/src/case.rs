//! What one benchmark row measures.

use edgellm_allreduce::kernels::Family;

/// One strategy row of the sweep. Every row is one all-reduce of `bytes` per call; a row that
/// cannot run at a size (the family does not serve it, no NCCL, AUTO picks NCCL in simulation)
/// is reported as `n/a`.
///
/// EXTENSION POINT: fused all-reduce + residual + RMSNorm rows. Add a variant here, e.g.
/// `FusedResidualRmsNorm(Family)`, give it a `name` and list it in [`Case::ALL`] (and
/// `runs_in`), then handle it where the compiler points: `sim::plan` / `real::Shared::plan`
/// (can it run at this size, with which kernel), `SimRun::enqueue` / `RealRun::enqueue` (one
/// call; the residual and weight buffers belong to the runner, next to its inputs and outputs),
/// and the reference of the check (`data::generate` sums the inputs; a fused row's expected
/// output is RMSNorm(sum + residual)·weight, and it may have two outputs to check). Timing,
/// graphs, CSV, table and plot need no change: they only see a row name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Case {
    /// `ncclAllReduce` called directly (real mode only).
    Nccl,
    /// One custom kernel family launched through `workspace::Group::launch`.
    Custom(Family),
    /// What AUTO (`strategy::choose`) picks for the call: a custom family, or NCCL.
    Auto,
    /// `plugin::PluginCore::enqueue` with AUTO after registering the communicators: exactly what
    /// TensorRT's call of the plugin runs (real mode only).
    Plugin,
}

impl Case {
    pub fn name(self) -> &'static str {
        match self {
            Case::Nccl => "nccl",
            Case::Custom(Family::OneShot) => "oneshot",
            Case::Custom(Family::TwoShot) => "twoshot",
            Case::Custom(Family::Lamport) => "lamport",
            Case::Auto => "auto",
            Case::Plugin => "plugin",
        }
    }

    pub fn parse(s: &str) -> Option<Case> {
        Case::ALL.into_iter().find(|c| c.name().eq_ignore_ascii_case(s.trim()))
    }

    pub const ALL: [Case; 6] = [
        Case::Nccl,
        Case::Custom(Family::OneShot),
        Case::Custom(Family::TwoShot),
        Case::Custom(Family::Lamport),
        Case::Auto,
        Case::Plugin,
    ];

    /// The rows of a mode when `--strategies` is not given.
    pub fn defaults(mode: Mode) -> Vec<Case> {
        Case::ALL.into_iter().filter(|c| c.runs_in(mode)).collect()
    }

    pub fn runs_in(self, mode: Mode) -> bool {
        match self {
            Case::Nccl | Case::Plugin => mode == Mode::Real,
            _ => true,
        }
    }

    /// AUTO and the plugin choose among the others: they are not candidates for "best".
    pub fn is_meta(self) -> bool {
        matches!(self, Case::Auto | Case::Plugin)
    }
}

/// The plain all-reduce call AUTO decides on (aligned buffers: the benchmark's are).
pub fn plain_call(tp_size: i32, dtype: edgellm_allreduce::tensor::DataType, bytes: u64) -> edgellm_allreduce::strategy::Call {
    let message = edgellm_allreduce::workspace::Message { bytes, rows: None };
    edgellm_allreduce::strategy::Call { tp_size, dtype, message, aligned: true }
}

/// Short name of a path actually taken (the `path` column, and the tag of AUTO/plugin cells).
pub fn path_name(path: edgellm_allreduce::strategy::Path) -> &'static str {
    use edgellm_allreduce::strategy::Path;
    match path {
        Path::Copy => "copy",
        Path::Nccl => "nccl",
        Path::Custom(f) => Case::Custom(f).name(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// N simulated ranks on GPU 0 (one GPU needed).
    Sim,
    /// One GPU per rank, one thread per GPU, in this process.
    Real,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sim => "sim",
            Mode::Real => "real",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_modes() {
        for c in Case::ALL {
            assert_eq!(Case::parse(c.name()), Some(c));
        }
        assert_eq!(Case::parse(" OneShot "), Some(Case::Custom(Family::OneShot)));
        assert_eq!(Case::parse("fast"), None);
        assert_eq!(Case::defaults(Mode::Sim).iter().map(|c| c.name()).collect::<Vec<_>>(), ["oneshot", "twoshot", "lamport", "auto"]);
        assert_eq!(Case::defaults(Mode::Real).len(), 6);
        assert!(Case::Auto.is_meta() && Case::Plugin.is_meta() && !Case::Nccl.is_meta());
    }
}
