//! AUTO tuned on the user's machine: AUTO's tables measured there by
//! `edgellm-allreduce-bench tune`, in a small versioned text file that takes the place of the
//! built-in tables (`crate::launch::strategy`) for groups on the links it was measured on.
//!
//! Where: `EDGELLM_ALLREDUCE_TUNING` names the file; unset, [`FILE_NAME`] beside this library
//! (found with `dladdr`, [`default_path`]) is read if it exists. A file that is unreadable,
//! malformed, truncated, of another format version, of another build of the library or of
//! another machine gives one warning naming the problem, and the built-in tables are used;
//! nothing in it can make the library panic.
//!
//! The format (v1), one item per line, blank lines and `#` comments ignored:
//!
//! ```text
//! edgellm-allreduce tuning v1
//! machine: gpu-node-7
//! driver: 580.82.09 (CUDA 13.0)
//! gpu: 0000:17:00.0 NVIDIA H200
//! gpu: 0000:3d:00.0 NVIDIA H200
//! links: nvlink
//! library: 0.1.0 EAR8
//! grid ranks=2 lamport ctas=64
//! plain ranks=2 dtype=any upto=2097152 lamport
//! plain ranks=2 dtype=any upto=67108864 twoshot
//! plain ranks=2 dtype=any upto=max nccl
//! fused ranks=2 dtype=bf16 rows=wide upto=2097152 fused:lamport
//! fused ranks=2 dtype=bf16 rows=wide upto=max split:oneshot
//! end rows=5
//! ```
//!
//! The header says where the tables hold: the host name, the driver, every GPU the tuner saw
//! (PCI bus id and name), the links of the groups it measured (`same-device`, `nvlink`, `pcie`)
//! and the library (crate version and the kernels' protocol id). A `grid` line (optional: files
//! of an older tune have none) caps the CTAs of one family's kernels on groups of one rank count,
//! as measured there ([`GridCap`]). A row is one table entry, as in
//! the built-in tables: for the op (`plain` all-reduce, or the `fused` all-reduce + residual +
//! RMSNorm with its row width, `narrow` up to `strategy::NARROW_ROW` elements, `wide` above, or
//! `any`), the rank count (exact) and the element type (`fp32`, `fp16`, `bf16`, or `any`), the
//! way to run messages of up to `upto` bytes (after the previous row's bound): a family
//! (`lamport`, `oneshot`, `twoshot`), and for the fused op `fused:<family>` or `split:<family>`
//! (the plain family, then the norm kernel), or `nccl`. A section's rows are together, their
//! bounds increase, and the last is `upto=max`. `end` counts the rows, so a file cut at a line
//! boundary, or with a row lost or doubled, is refused rather than read as other tables.

use crate::contract::EAR_MAX_BLOCKS;
use crate::fingerprint::fnv1a;
use crate::launch::family::{Family, Op, RANK_COUNTS};
use crate::launch::tables::{FusedChoice, NARROW_ROW};
use crate::launch::Message;
use crate::link::LinkClass;
use crate::tensor::DataType;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod load;
mod machine;
mod row;
mod text;

#[cfg(test)]
use load::load;
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub use load::{active, active_fingerprint};
pub use machine::*;
use row::*;
use text::*;

/// The format version this library reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// The first line's words before the version.
pub(super) const MAGIC: &str = "edgellm-allreduce tuning";
/// The file's name beside the library when `EDGELLM_ALLREDUCE_TUNING` is unset.
pub const FILE_NAME: &str = "edgellm-allreduce-tuning.txt";
/// Larger files are not tuning files (a real one is a few KiB): never read whole.
pub(super) const MAX_FILE_BYTES: u64 = 1 << 20;
/// Which op a section tunes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TunedOp {
    /// The all-reduce alone.
    Plain,
    /// The all-reduce + residual + RMSNorm.
    Fused,
}

/// The row width class of a fused section: up to [`NARROW_ROW`] elements, wider, or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RowWidth {
    Narrow,
    Wide,
    Any,
}

impl RowWidth {
    /// The class of rows of `hidden` elements.
    pub fn of(hidden: u32) -> RowWidth {
        if hidden > NARROW_ROW {
            RowWidth::Wide
        } else {
            RowWidth::Narrow
        }
    }
}

/// What one section's rows are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SectionKey {
    pub op: TunedOp,
    /// A rank count of [`RANK_COUNTS`], exactly.
    pub nranks: i32,
    /// None: every element type.
    pub dtype: Option<DataType>,
    /// The fused op's row width; None for the plain op.
    pub width: Option<RowWidth>,
}

/// The table of one key: `(upto, way)` rows, bounds increasing, the last `u64::MAX`. The plain
/// op's ways are `FusedChoice::Fused(family)` (the family) and `Nccl` (as `strategy`'s AUTO
/// reads its plain tables).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub key: SectionKey,
    pub rows: Vec<(u64, FusedChoice)>,
}

/// The grid a family's kernels get on groups of `nranks` (`grid ranks=<n> <family> ctas=<c>`):
/// at most `ctas` CTAs, whatever the group's cap (the kernels are correct at any grid). Over
/// PCIe a few CTAs keep the link busy and leave the SMs to the model (`crate::launch::tables`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GridCap {
    pub nranks: i32,
    pub family: Family,
    pub ctas: u32,
}

/// A tuning file: where it was measured, and its tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    pub machine: Machine,
    /// The links of the groups measured: the tables serve groups of this class only.
    pub links: LinkClass,
    /// [`library_id`] of the build that measured it.
    pub library: String,
    /// The grids measured best, per rank count and family (a file of an older tune has none:
    /// the built-in caps then hold).
    pub grids: Vec<GridCap>,
    pub sections: Vec<Section>,
}

/// What kind of problem a file has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TuningErrorKind {
    /// It cannot be read (missing, unreadable, too large, not UTF-8).
    Io,
    /// Its first line is not a tuning file's.
    NotTuning,
    /// Another format version.
    Version,
    /// A line that does not parse.
    Syntax,
    /// Rows that break the table rules (order, unbounded last row, rank counts, ways).
    Table,
    /// Cut short, or rows lost or added (the end line).
    Truncated,
    /// Measured with another build of the library.
    Library,
    /// Measured on another machine (host, driver, GPUs).
    Foreign,
}

/// Why a tuning file is refused, and where (line numbers count from 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuningError {
    pub kind: TuningErrorKind,
    pub line: Option<usize>,
    pub message: String,
}

impl TuningError {
    fn new(kind: TuningErrorKind, line: Option<usize>, message: impl Into<String>) -> Self {
        TuningError { kind, line, message: message.into() }
    }
}

impl fmt::Display for TuningError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for TuningError {}

impl Tuning {
    /// Checks the table rules (what [`Tuning::parse`] checks of the rows) of tables made in
    /// memory, before they are written.
    pub fn validate(&self) -> Result<(), TuningError> {
        if self.links == LinkClass::NoPeer {
            return Err(TuningError::new(TuningErrorKind::Table, None, "no tables for groups without peer access"));
        }
        check_sections(&self.sections, &|_, _| None)
    }

    /// Whether a row of the file for groups of `nranks` on links of `class` chooses a family that
    /// loads from its peers (its measurements found one faster there).
    pub(crate) fn chooses_pull(&self, class: LinkClass, nranks: i32) -> bool {
        self.links == class
            && self.sections.iter().filter(|s| s.key.nranks == nranks).any(|s| {
                s.rows.iter().any(|&(_, way)| match (s.key.op, way) {
                    (_, FusedChoice::Nccl) => false,
                    (TunedOp::Plain, FusedChoice::Fused(f)) | (_, FusedChoice::Split(f)) => {
                        !f.writes_into_peers(Op::AllReduce, nranks)
                    }
                    (TunedOp::Fused, FusedChoice::Fused(f)) => !f.writes_into_peers(Op::ResidualRmsNorm, nranks),
                })
            })
    }

    /// A stable hash of what AUTO reads from the file (the links and the rows, not the header
    /// nor comments); never 0, which the exchange record reserves for no file.
    pub fn fingerprint(&self) -> u64 {
        // Section by section, sorted: the order of sections in the file means nothing.
        let mut sections: Vec<String> = self
            .sections
            .iter()
            .map(|s| s.rows.iter().map(|&(b, w)| row_text(&s.key, b, w) + "\n").collect())
            .collect();
        sections.sort_unstable();
        let grids: String = self.grids.iter().map(|&g| grid_text(g) + "\n").collect();
        let text = format!("links: {}\n{grids}{}", self.links.token(), sections.concat());
        fnv1a(text.as_bytes()).max(1)
    }

    /// Whether the file was measured with this build on `current`: the library id, the host, the
    /// driver, and every GPU of `current` among the file's (bus id and name: a process may see
    /// fewer GPUs than the tuner did). The error names every difference.
    pub fn check(&self, current: &Machine) -> Result<(), TuningError> {
        let this = library_id();
        if self.library != this {
            return Err(TuningError::new(
                TuningErrorKind::Library,
                None,
                format!("measured with library {}, this is {this}: tune again with this build", self.library),
            ));
        }
        let mut differences = Vec::new();
        if self.machine.host != current.host {
            differences.push(format!("measured on host '{}', this is '{}'", self.machine.host, current.host));
        }
        if self.machine.driver != current.driver {
            differences
                .push(format!("measured with driver {}, this machine has {}", self.machine.driver, current.driver));
        }
        for gpu in &current.gpus {
            match self.machine.gpus.iter().find(|g| g.bus_id == gpu.bus_id) {
                Some(g) if g.name == gpu.name => {}
                Some(g) => differences
                    .push(format!("the GPU at {} is an {} here, an {} in the file", gpu.bus_id, gpu.name, g.name)),
                None => differences.push(format!("GPU {} ({}) is not among the file's GPUs", gpu.bus_id, gpu.name)),
            }
        }
        if differences.is_empty() {
            Ok(())
        } else {
            Err(TuningError::new(
                TuningErrorKind::Foreign,
                None,
                format!("another machine's file: {}", differences.join("; ")),
            ))
        }
    }

    /// AUTO's choice for a call of `nranks` ranks over links of `class`, if the file was
    /// measured on such links and has a section for it: the element type's own section before
    /// `dtype=any`, then (fused) the row width's own before `rows=any`.
    pub fn choice(&self, class: LinkClass, nranks: i32, dtype: DataType, message: &Message) -> Option<FusedChoice> {
        if class != self.links {
            return None;
        }
        let (op, widths): (TunedOp, &[Option<RowWidth>]) = match message.rows {
            None => (TunedOp::Plain, &[None]),
            Some((_, hidden)) => (
                TunedOp::Fused,
                if RowWidth::of(hidden) == RowWidth::Wide {
                    &[Some(RowWidth::Wide), Some(RowWidth::Any)]
                } else {
                    &[Some(RowWidth::Narrow), Some(RowWidth::Any)]
                },
            ),
        };
        let section = [Some(dtype), None].into_iter().find_map(|dtype| {
            widths.iter().find_map(|&width| {
                let key = SectionKey { op, nranks, dtype, width };
                self.sections.iter().find(|s| s.key == key)
            })
        })?;
        section.rows.iter().find(|(bound, _)| message.bytes <= *bound).map(|&(_, way)| way)
    }

    /// The grid cap measured for `family` on groups of `nranks` on links of `class`, if any.
    pub(crate) fn grid(&self, class: LinkClass, nranks: i32, family: Family) -> Option<u32> {
        (class == self.links)
            .then(|| self.grids.iter().find(|g| g.nranks == nranks && g.family == family).map(|g| g.ctas))
            .flatten()
    }
}
#[cfg(test)]
mod tests;
