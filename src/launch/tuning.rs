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
//! and the library (crate version and the kernels' protocol id). A row is one table entry, as in
//! the built-in tables: for the op (`plain` all-reduce, or the `fused` all-reduce + residual +
//! RMSNorm with its row width, `narrow` up to `strategy::NARROW_ROW` elements, `wide` above, or
//! `any`), the rank count (exact) and the element type (`fp32`, `fp16`, `bf16`, or `any`), the
//! way to run messages of up to `upto` bytes (after the previous row's bound): a family
//! (`lamport`, `oneshot`, `twoshot`), and for the fused op `fused:<family>` or `split:<family>`
//! (the plain family, then the norm kernel), or `nccl`. A section's rows are together, their
//! bounds increase, and the last is `upto=max`. `end` counts the rows, so a file cut at a line
//! boundary, or with a row lost or doubled, is refused rather than read as other tables.

use crate::launch::family::{Family, RANK_COUNTS};
use crate::launch::Message;
use crate::link::LinkClass;
use crate::launch::strategy::{FusedChoice, NARROW_ROW};
use crate::tensor::DataType;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The format version this library reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// The first line's words before the version.
const MAGIC: &str = "edgellm-allreduce tuning";
/// The file's name beside the library when `EDGELLM_ALLREDUCE_TUNING` is unset.
pub const FILE_NAME: &str = "edgellm-allreduce-tuning.txt";
/// Larger files are not tuning files (a real one is a few KiB): never read whole.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// FNV-1a, 64 bits: a stable hash (the same on every build and machine) for fingerprints.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| {
        (h ^ c as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// One GPU as the tuner saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// `domain:bus:device.function`, lower case ("0000:17:00.0"): stable across
    /// `CUDA_VISIBLE_DEVICES`, unlike the ordinal.
    pub bus_id: String,
    pub name: String,
}

/// What a tuning file must have been measured on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// The host name (in a container, the container's: give it a stable one).
    pub host: String,
    /// The kernel module's version and the CUDA version of the driver.
    pub driver: String,
    /// Every GPU this process sees, by bus id.
    pub gpus: Vec<Gpu>,
}

impl Machine {
    /// This machine as this process sees it (its GPUs: those CUDA shows it).
    pub fn current() -> Result<Machine, String> {
        let err = |e: crate::Error| e.to_string();
        let count = crate::cuda::device_count().map_err(err)?;
        let gpus = (0..count)
            .map(|d| {
                Ok(Gpu {
                    bus_id: one_line(&crate::cuda::pci_bus_id(d).map_err(err)?),
                    name: one_line(&crate::cuda::device_name(d).map_err(err)?),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let mut gpus = gpus;
        gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        let module = std::fs::read_to_string("/proc/driver/nvidia/version").ok();
        let version = crate::cuda::driver_version().map_err(err)?;
        Ok(Machine {
            host: one_line(&host_name()),
            driver: driver_description(version, module.as_deref()),
            gpus,
        })
    }
}

/// `580.82.09 (CUDA 13.0)` from `cuDriverGetVersion` and `/proc/driver/nvidia/version` (the
/// module's version; the CUDA version alone without it).
fn driver_description(cuda_version: i32, proc_version: Option<&str>) -> String {
    let cuda = format!("CUDA {}.{}", cuda_version / 1000, cuda_version % 1000 / 10);
    let is_version = |t: &&str| {
        t.contains('.')
            && t.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    let module = proc_version
        .and_then(|text| text.lines().find(|l| l.starts_with("NVRM version")))
        .and_then(|line| line.split_whitespace().find(is_version));
    match module {
        Some(m) => format!("{m} ({cuda})"),
        None => cuda,
    }
}

/// The host name (empty when the system has none).
fn host_name() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most name.len() bytes.
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

/// `s` on one line: control characters become spaces, the ends trimmed.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// This build: the crate's version and the kernels' protocol id ("0.1.0 EAR8").
pub fn library_id() -> String {
    let id = crate::launch::contract::EAR_PROTOCOL_ID.to_be_bytes();
    format!(
        "{} {}",
        env!("CARGO_PKG_VERSION"),
        String::from_utf8_lossy(&id)
    )
}

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

/// A tuning file: where it was measured, and its tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    pub machine: Machine,
    /// The links of the groups measured: the tables serve groups of this class only.
    pub links: LinkClass,
    /// [`library_id`] of the build that measured it.
    pub library: String,
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
        TuningError {
            kind,
            line,
            message: message.into(),
        }
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

fn dtype_token(dtype: Option<DataType>) -> &'static str {
    match dtype {
        None => "any",
        Some(DataType::Float) => "fp32",
        Some(DataType::Half) => "fp16",
        Some(DataType::Bf16) => "bf16",
    }
}

fn parse_dtype(token: &str) -> Option<Option<DataType>> {
    match token {
        "any" => Some(None),
        "fp32" => Some(Some(DataType::Float)),
        "fp16" => Some(Some(DataType::Half)),
        "bf16" => Some(Some(DataType::Bf16)),
        _ => None,
    }
}

fn width_token(width: RowWidth) -> &'static str {
    match width {
        RowWidth::Narrow => "narrow",
        RowWidth::Wide => "wide",
        RowWidth::Any => "any",
    }
}

fn family_token(family: Family) -> &'static str {
    match family {
        Family::OneShot => "oneshot",
        Family::TwoShot => "twoshot",
        Family::Lamport => "lamport",
    }
}

fn parse_family(token: &str) -> Option<Family> {
    Family::ALL.into_iter().find(|f| family_token(*f) == token)
}

/// The word of a way in a section of `op`: `oneshot` / `nccl` (plain), `fused:lamport` /
/// `split:twoshot` / `nccl` (fused).
pub fn way_token(op: TunedOp, way: FusedChoice) -> String {
    match (op, way) {
        (_, FusedChoice::Nccl) => "nccl".to_owned(),
        (TunedOp::Plain, FusedChoice::Fused(f)) => family_token(f).to_owned(),
        (TunedOp::Plain, FusedChoice::Split(f)) => format!("split:{}", family_token(f)),
        (TunedOp::Fused, FusedChoice::Fused(f)) => format!("fused:{}", family_token(f)),
        (TunedOp::Fused, FusedChoice::Split(f)) => format!("split:{}", family_token(f)),
    }
}

fn parse_way(op: TunedOp, token: &str) -> Option<FusedChoice> {
    if token == "nccl" {
        return Some(FusedChoice::Nccl);
    }
    match (op, token.split_once(':')) {
        (TunedOp::Plain, None) => parse_family(token).map(FusedChoice::Fused),
        (TunedOp::Fused, Some(("fused", f))) => parse_family(f).map(FusedChoice::Fused),
        (TunedOp::Fused, Some(("split", f))) => parse_family(f).map(FusedChoice::Split),
        _ => None,
    }
}

/// `4096`, `64K`, `2M`, `1G` (powers of 1024), or `max`.
fn parse_bound(token: &str) -> Option<u64> {
    if token == "max" {
        return Some(u64::MAX);
    }
    let (digits, shift) = match token.as_bytes().last()? {
        b'K' => (&token[..token.len() - 1], 10),
        b'M' => (&token[..token.len() - 1], 20),
        b'G' => (&token[..token.len() - 1], 30),
        _ => (token, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    // u64::MAX is spelled `max`: a number that large (or larger once scaled) is refused.
    value
        .checked_mul(1u64 << shift)
        .filter(|&b| b != u64::MAX && b > 0)
}

fn bound_token(bound: u64) -> String {
    if bound == u64::MAX {
        "max".to_owned()
    } else {
        bound.to_string()
    }
}

impl fmt::Display for SectionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            TunedOp::Plain => "plain",
            TunedOp::Fused => "fused",
        };
        write!(
            f,
            "{op} ranks={} dtype={}",
            self.nranks,
            dtype_token(self.dtype)
        )?;
        if let Some(w) = self.width {
            write!(f, " rows={}", width_token(w))?;
        }
        Ok(())
    }
}

/// One row as the file spells it.
fn row_text(key: &SectionKey, bound: u64, way: FusedChoice) -> String {
    format!(
        "{key} upto={} {}",
        bound_token(bound),
        way_token(key.op, way)
    )
}

/// The lines that matter, numbered from 1: blank lines and `#` comments skipped, ends trimmed.
fn content_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// Checks the table rules of `sections`; `line(s, r)` is the line of row `r` of section `s`
/// (None for tables not read from a file).
fn check_sections(
    sections: &[Section],
    line: &dyn Fn(usize, usize) -> Option<usize>,
) -> Result<(), TuningError> {
    let table = |l: Option<usize>, m: String| Err(TuningError::new(TuningErrorKind::Table, l, m));
    if sections.is_empty() {
        return table(None, "no table rows".to_owned());
    }
    for (s, section) in sections.iter().enumerate() {
        let key = &section.key;
        let first = line(s, 0);
        if !RANK_COUNTS.contains(&key.nranks) {
            return table(
                first,
                format!(
                    "ranks={}: the kernels exist for {RANK_COUNTS:?} ranks",
                    key.nranks
                ),
            );
        }
        if (key.op == TunedOp::Fused) != key.width.is_some() {
            return table(
                first,
                format!("{key}: a fused section has a rows= class, a plain one none"),
            );
        }
        if let Some(other) = sections[..s].iter().position(|o| o.key == section.key) {
            let at = |l: Option<usize>| l.map_or(String::new(), |l| format!(" (line {l})"));
            return table(
                first,
                format!(
                    "the rows of {key} are in two places{} and{}: a section's rows are together",
                    at(line(other, 0)),
                    at(first)
                ),
            );
        }
        let Some(&(last, _)) = section.rows.last() else {
            return table(first, format!("{key} has no rows"));
        };
        for (r, &(bound, way)) in section.rows.iter().enumerate() {
            if key.op == TunedOp::Plain && matches!(way, FusedChoice::Split(_)) {
                return table(line(s, r), format!("{key}: only the fused op splits"));
            }
            if r > 0 && bound <= section.rows[r - 1].0 {
                return table(
                    line(s, r),
                    format!(
                        "{key}: upto={} after upto={}: the bounds must increase",
                        bound_token(bound),
                        bound_token(section.rows[r - 1].0)
                    ),
                );
            }
        }
        if last != u64::MAX {
            return table(
                line(s, section.rows.len() - 1),
                format!("{key}: the last row ends at {last} bytes: it must be upto=max"),
            );
        }
    }
    Ok(())
}

impl Tuning {
    /// Parses and checks a file's text (everything but whether it was measured here:
    /// [`Tuning::check`]).
    pub fn parse(text: &str) -> Result<Tuning, TuningError> {
        use TuningErrorKind::*;
        let mut lines = content_lines(text).peekable();
        // The version line.
        let Some((n, first)) = lines.next() else {
            return Err(TuningError::new(NotTuning, None, "the file is empty"));
        };
        let Some(version) = first.strip_prefix(MAGIC) else {
            return Err(TuningError::new(
                NotTuning,
                Some(n),
                format!("not a tuning file: the first line must be '{MAGIC} v{FORMAT_VERSION}'"),
            ));
        };
        let version = version
            .trim()
            .strip_prefix('v')
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| {
                TuningError::new(Syntax, Some(n), format!("'{first}': no version number"))
            })?;
        if version != FORMAT_VERSION {
            let age = if version < FORMAT_VERSION {
                "an older format: tune again with this library's edgellm-allreduce-bench"
            } else {
                "a newer format than this library reads"
            };
            return Err(TuningError::new(
                Version,
                Some(n),
                format!("format v{version} is {age} (it reads v{FORMAT_VERSION})"),
            ));
        }
        // The header fields, in order.
        let (_, host) = next_field(&mut lines, "machine")?;
        let (_, driver) = next_field(&mut lines, "driver")?;
        let mut gpus: Vec<Gpu> = Vec::new();
        loop {
            let (n, value) = next_field(&mut lines, "gpu")?;
            let Some((bus_id, name)) = value.split_once(char::is_whitespace) else {
                return Err(TuningError::new(
                    Syntax,
                    Some(n),
                    "'gpu:' needs a PCI bus id and a name",
                ));
            };
            if gpus.last().is_some_and(|g| g.bus_id.as_str() >= bus_id) {
                return Err(TuningError::new(
                    Syntax,
                    Some(n),
                    format!("gpu {bus_id}: the GPUs are listed once each, by bus id"),
                ));
            }
            gpus.push(Gpu {
                bus_id: bus_id.to_owned(),
                name: name.trim().to_owned(),
            });
            if !lines.peek().is_some_and(|(_, l)| l.starts_with("gpu:")) {
                break;
            }
        }
        let (n, links) = next_field(&mut lines, "links")?;
        let links = match LinkClass::from_token(&links) {
            Some(LinkClass::NoPeer) => {
                return Err(TuningError::new(
                    Table,
                    Some(n),
                    "links: no-peer: no custom kernel runs without peer access, so there is nothing to tune",
                ))
            }
            Some(class) => class,
            None => {
                return Err(TuningError::new(
                    Syntax,
                    Some(n),
                    format!("links: '{links}' is not same-device, nvlink or pcie"),
                ))
            }
        };
        let (_, library) = next_field(&mut lines, "library")?;
        // The rows, then the end line.
        let mut sections: Vec<Section> = Vec::new();
        let mut row_lines: Vec<Vec<usize>> = Vec::new();
        let mut rows = 0usize;
        let (end_line, count) = loop {
            let Some((n, l)) = lines.next() else {
                return Err(cut_short("its end line"));
            };
            if let Some(count) = l.strip_prefix("end") {
                break (n, count.trim());
            }
            let (key, bound, way) = parse_row(n, l)?;
            match sections.last_mut() {
                Some(s) if s.key == key => s.rows.push((bound, way)),
                _ => {
                    sections.push(Section {
                        key,
                        rows: vec![(bound, way)],
                    });
                    row_lines.push(Vec::new());
                }
            }
            if let Some(lines) = row_lines.last_mut() {
                lines.push(n);
            }
            rows += 1;
        };
        let counted = count
            .strip_prefix("rows=")
            .and_then(|c| c.parse::<usize>().ok())
            .ok_or_else(|| {
                TuningError::new(
                    Syntax,
                    Some(end_line),
                    format!("'end {count}': expected 'end rows=<count>'"),
                )
            })?;
        if counted != rows {
            return Err(TuningError::new(
                Truncated,
                Some(end_line),
                format!("the end line counts {counted} rows, the file has {rows}: rows were lost or added"),
            ));
        }
        if let Some((n, l)) = lines.next() {
            return Err(TuningError::new(
                Syntax,
                Some(n),
                format!("'{l}' after the end line (line {end_line})"),
            ));
        }
        check_sections(&sections, &|s, r| {
            row_lines.get(s).and_then(|l| l.get(r)).copied()
        })?;
        Ok(Tuning {
            machine: Machine { host, driver, gpus },
            links,
            library,
            sections,
        })
    }

    /// Checks the table rules (what [`Tuning::parse`] checks of the rows) of tables made in
    /// memory, before they are written.
    pub fn validate(&self) -> Result<(), TuningError> {
        if self.links == LinkClass::NoPeer {
            return Err(TuningError::new(
                TuningErrorKind::Table,
                None,
                "no tables for groups without peer access",
            ));
        }
        check_sections(&self.sections, &|_, _| None)
    }

    /// The file's text ([`Tuning::parse`] of it gives `self` back).
    pub fn to_text(&self) -> String {
        let mut out = format!("{MAGIC} v{FORMAT_VERSION}\n");
        out += &format!("machine: {}\n", self.machine.host);
        out += &format!("driver: {}\n", self.machine.driver);
        for g in &self.machine.gpus {
            out += &format!("gpu: {} {}\n", g.bus_id, g.name);
        }
        out += &format!("links: {}\n", self.links.token());
        out += &format!("library: {}\n", self.library);
        out += &self.rows_text();
        out += &format!(
            "end rows={}\n",
            self.sections.iter().map(|s| s.rows.len()).sum::<usize>()
        );
        out
    }

    fn rows_text(&self) -> String {
        let mut out = String::new();
        for s in &self.sections {
            for &(bound, way) in &s.rows {
                out += &row_text(&s.key, bound, way);
                out.push('\n');
            }
        }
        out
    }

    /// A stable hash of what AUTO reads from the file (the links and the rows, not the header
    /// nor comments); never 0, which the exchange record reserves for no file.
    pub fn fingerprint(&self) -> u64 {
        // Section by section, sorted: the order of sections in the file means nothing.
        let mut sections: Vec<String> = self
            .sections
            .iter()
            .map(|s| {
                s.rows
                    .iter()
                    .map(|&(b, w)| row_text(&s.key, b, w) + "\n")
                    .collect()
            })
            .collect();
        sections.sort_unstable();
        let text = format!("links: {}\n{}", self.links.token(), sections.concat());
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
                format!(
                    "measured with library {}, this is {this}: tune again with this build",
                    self.library
                ),
            ));
        }
        let mut differences = Vec::new();
        if self.machine.host != current.host {
            differences.push(format!(
                "measured on host '{}', this is '{}'",
                self.machine.host, current.host
            ));
        }
        if self.machine.driver != current.driver {
            differences.push(format!(
                "measured with driver {}, this machine has {}",
                self.machine.driver, current.driver
            ));
        }
        for gpu in &current.gpus {
            match self.machine.gpus.iter().find(|g| g.bus_id == gpu.bus_id) {
                Some(g) if g.name == gpu.name => {}
                Some(g) => differences.push(format!(
                    "the GPU at {} is an {} here, an {} in the file",
                    gpu.bus_id, gpu.name, g.name
                )),
                None => differences.push(format!(
                    "GPU {} ({}) is not among the file's GPUs",
                    gpu.bus_id, gpu.name
                )),
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
    pub fn choice(
        &self,
        class: LinkClass,
        nranks: i32,
        dtype: DataType,
        message: &Message,
    ) -> Option<FusedChoice> {
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
                let key = SectionKey {
                    op,
                    nranks,
                    dtype,
                    width,
                };
                self.sections.iter().find(|s| s.key == key)
            })
        })?;
        section
            .rows
            .iter()
            .find(|(bound, _)| message.bytes <= *bound)
            .map(|&(_, way)| way)
    }
}

/// The file ends before `what`.
fn cut_short(what: &str) -> TuningError {
    TuningError::new(
        TuningErrorKind::Truncated,
        None,
        format!("the file ends before {what}: it is cut short"),
    )
}

/// The next line, which must be the header field `key:` with a value: its number and value.
fn next_field<'a>(
    lines: &mut impl Iterator<Item = (usize, &'a str)>,
    key: &str,
) -> Result<(usize, String), TuningError> {
    let syntax = |n: usize, m: String| TuningError::new(TuningErrorKind::Syntax, Some(n), m);
    let Some((n, l)) = lines.next() else {
        return Err(cut_short(&format!("its '{key}:' line")));
    };
    match l.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
        Some(v) if !v.trim().is_empty() => Ok((n, v.trim().to_owned())),
        Some(_) => Err(syntax(n, format!("'{key}:' is empty"))),
        None => Err(syntax(
            n,
            format!("expected the '{key}:' line, found '{l}'"),
        )),
    }
}

/// One row line: `<op> ranks=<n> dtype=<t> [rows=<w>] upto=<bytes> <way>`.
fn parse_row(n: usize, line: &str) -> Result<(SectionKey, u64, FusedChoice), TuningError> {
    let syntax = |m: String| Err(TuningError::new(TuningErrorKind::Syntax, Some(n), m));
    let words: Vec<&str> = line.split_whitespace().collect();
    let op = match words.first() {
        Some(&"plain") => TunedOp::Plain,
        Some(&"fused") => TunedOp::Fused,
        _ => {
            return syntax(format!(
                "'{line}' is not a row (plain ... or fused ...) nor the end line"
            ))
        }
    };
    let keys: &[&str] = match op {
        TunedOp::Plain => &["ranks", "dtype", "upto"],
        TunedOp::Fused => &["ranks", "dtype", "rows", "upto"],
    };
    if words.len() != keys.len() + 2 {
        let shape = keys
            .iter()
            .map(|k| format!("{k}=..."))
            .collect::<Vec<_>>()
            .join(" ");
        return syntax(format!("'{line}': expected '{} {shape} <way>'", words[0]));
    }
    let mut values = Vec::new();
    for (key, word) in keys.iter().zip(&words[1..]) {
        match word.split_once('=') {
            Some((k, v)) if k == *key => values.push(v),
            _ => return syntax(format!("'{word}': expected {key}=...")),
        }
    }
    let Some(nranks) = values[0].parse::<i32>().ok() else {
        return syntax(format!("ranks={}: not a rank count", values[0]));
    };
    let Some(dtype) = parse_dtype(values[1]) else {
        return syntax(format!("dtype={}: not fp32, fp16, bf16 or any", values[1]));
    };
    let width = match op {
        TunedOp::Plain => None,
        TunedOp::Fused => Some(match values[2] {
            "narrow" => RowWidth::Narrow,
            "wide" => RowWidth::Wide,
            "any" => RowWidth::Any,
            w => return syntax(format!("rows={w}: not narrow, wide or any")),
        }),
    };
    let bound_text = values[values.len() - 1];
    let Some(bound) = parse_bound(bound_text) else {
        return syntax(format!(
            "upto={bound_text}: not a byte count (4096, 64K, 2M, 1G) nor max"
        ));
    };
    let way_text = words[words.len() - 1];
    let Some(way) = parse_way(op, way_text) else {
        let known = match op {
            TunedOp::Plain => "lamport, oneshot, twoshot, nccl",
            TunedOp::Fused => {
                "fused:<family>, split:<family>, nccl; families lamport, oneshot, twoshot"
            }
        };
        return syntax(format!("'{way_text}' is not a way ({known})"));
    };
    Ok((
        SectionKey {
            op,
            nranks,
            dtype,
            width,
        },
        bound,
        way,
    ))
}

/// Where the tuning file is looked for when `EDGELLM_ALLREDUCE_TUNING` is unset: [`FILE_NAME`]
/// in the directory of the file that holds this library.
pub fn default_path() -> Option<PathBuf> {
    let (file, _) = crate::overlay::loader::this_object()?;
    Some(file.parent()?.join(FILE_NAME))
}

/// Reads and checks the file at `path` against `machine()` (asked only when the file parses).
/// `Ok(None)`: no file where none was asked for (`explicit` false: the default place).
pub fn load(
    path: &Path,
    explicit: bool,
    machine: impl FnOnce() -> Result<Machine, String>,
) -> Result<Option<Tuning>, TuningError> {
    let io = |m: String| TuningError::new(TuningErrorKind::Io, None, m);
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(None),
        Err(e) => return Err(io(format!("cannot read it: {e}"))),
    };
    if size > MAX_FILE_BYTES {
        return Err(io(format!(
            "{size} bytes: larger than any tuning file ({MAX_FILE_BYTES} at most)"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| io(format!("cannot read it: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| io("not UTF-8 text".to_owned()))?;
    // Parsing is written not to panic; should it, the built-in tables still serve.
    let parsed = std::panic::catch_unwind(|| Tuning::parse(&text)).unwrap_or_else(|_| {
        Err(TuningError::new(
            TuningErrorKind::Syntax,
            None,
            "the parser failed on it",
        ))
    })?;
    let current = machine().map_err(|e| {
        TuningError::new(
            TuningErrorKind::Foreign,
            None,
            format!("cannot tell which machine this is ({e})"),
        )
    })?;
    parsed.check(&current)?;
    Ok(Some(parsed))
}

/// The tuning file of this process, read once (`EDGELLM_ALLREDUCE_TUNING`, else
/// [`default_path`]); None when there is none or it was refused (one warning says why).
pub fn active() -> Option<&'static Tuning> {
    static ACTIVE: OnceLock<Option<Tuning>> = OnceLock::new();
    ACTIVE
        .get_or_init(|| {
            let configured = crate::config().tuning_file.clone();
            let explicit = configured.is_some();
            let path = configured.or_else(default_path)?;
            match load(&path, explicit, Machine::current) {
                Ok(Some(t)) => {
                    crate::log::info(&format!(
                        "tuning file {}: AUTO uses its tables for groups over {} links (fingerprint {:016x})",
                        path.display(),
                        t.links.name(),
                        t.fingerprint()
                    ));
                    Some(t)
                }
                Ok(None) => None,
                Err(e) => {
                    crate::log::warning(&format!("tuning file {}: {e}; AUTO uses its built-in tables", path.display()));
                    None
                }
            }
        })
        .as_ref()
}

/// [`Tuning::fingerprint`] of this process's tuning file, 0 without one.
pub fn active_fingerprint() -> u64 {
    active().map_or(0, Tuning::fingerprint)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            host: "gpu-node-7".into(),
            driver: "580.82.09 (CUDA 13.0)".into(),
            gpus: vec![
                Gpu {
                    bus_id: "0000:17:00.0".into(),
                    name: "NVIDIA H200".into(),
                },
                Gpu {
                    bus_id: "0000:3d:00.0".into(),
                    name: "NVIDIA H200".into(),
                },
            ],
        }
    }

    fn key(
        op: TunedOp,
        nranks: i32,
        dtype: Option<DataType>,
        width: Option<RowWidth>,
    ) -> SectionKey {
        SectionKey {
            op,
            nranks,
            dtype,
            width,
        }
    }

    fn sample() -> Tuning {
        use FusedChoice::*;
        Tuning {
            machine: machine(),
            links: LinkClass::Pcie,
            library: library_id(),
            sections: vec![
                Section {
                    key: key(TunedOp::Plain, 2, None, None),
                    rows: vec![
                        (32 << 10, Fused(Family::Lamport)),
                        (4 << 20, Fused(Family::OneShot)),
                        (u64::MAX, Nccl),
                    ],
                },
                Section {
                    key: key(TunedOp::Plain, 2, Some(DataType::Float), None),
                    rows: vec![
                        (8 << 10, Fused(Family::Lamport)),
                        (u64::MAX, Fused(Family::TwoShot)),
                    ],
                },
                Section {
                    key: key(
                        TunedOp::Fused,
                        2,
                        Some(DataType::Bf16),
                        Some(RowWidth::Wide),
                    ),
                    rows: vec![
                        (16 << 10, Fused(Family::Lamport)),
                        (1 << 20, Split(Family::OneShot)),
                        (u64::MAX, Nccl),
                    ],
                },
                Section {
                    key: key(TunedOp::Fused, 2, None, Some(RowWidth::Any)),
                    rows: vec![(u64::MAX, Fused(Family::OneShot))],
                },
                Section {
                    key: key(TunedOp::Plain, 4, None, None),
                    rows: vec![(u64::MAX, Nccl)],
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let t = sample();
        t.validate().unwrap();
        let text = t.to_text();
        assert!(
            text.starts_with("edgellm-allreduce tuning v1\nmachine: gpu-node-7\n"),
            "{text}"
        );
        assert!(
            text.contains("\nplain ranks=2 dtype=any upto=32768 lamport\n"),
            "{text}"
        );
        assert!(
            text.contains("\nfused ranks=2 dtype=bf16 rows=wide upto=1048576 split:oneshot\n"),
            "{text}"
        );
        assert!(
            text.ends_with("plain ranks=4 dtype=any upto=max nccl\nend rows=10\n"),
            "{text}"
        );
        let back = Tuning::parse(&text).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.to_text(), text);
        assert_eq!(back.fingerprint(), t.fingerprint());
        // Comments, blank lines, indentation and spelled-out sizes change nothing AUTO reads.
        let decorated = format!(
            "# measured by hand\n\n{}",
            text.replace("upto=32768", "upto=32K")
                .replace("\nplain", "\n  plain")
        );
        let back = Tuning::parse(&decorated).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.fingerprint(), t.fingerprint());
        back.check(&machine()).unwrap();
    }

    #[test]
    fn fingerprints_follow_the_tables_not_the_header() {
        let t = sample();
        let mut other_host = t.clone();
        other_host.machine.host = "elsewhere".into();
        assert_eq!(other_host.fingerprint(), t.fingerprint());
        let mut other_row = t.clone();
        other_row.sections[0].rows[0].0 = 16 << 10;
        assert_ne!(other_row.fingerprint(), t.fingerprint());
        let mut other_links = t.clone();
        other_links.links = LinkClass::NvLink;
        assert_ne!(other_links.fingerprint(), t.fingerprint());
        assert_ne!(t.fingerprint(), 0);
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325, "FNV-1a's offset basis");
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a of 'a'");
    }

    #[test]
    fn lookups_prefer_the_dtype_then_the_width_and_only_on_their_links() {
        let t = sample();
        let plain = |bytes| Message { bytes, rows: None };
        let fused = |tokens: u64, hidden: u32| Message {
            bytes: tokens * hidden as u64 * 2,
            rows: Some((tokens, hidden)),
        };
        use FusedChoice::*;
        let pcie = LinkClass::Pcie;
        assert_eq!(
            t.choice(pcie, 2, DataType::Bf16, &plain(32 << 10)),
            Some(Fused(Family::Lamport))
        );
        assert_eq!(
            t.choice(pcie, 2, DataType::Bf16, &plain((32 << 10) + 16)),
            Some(Fused(Family::OneShot))
        );
        assert_eq!(
            t.choice(pcie, 2, DataType::Bf16, &plain(64 << 20)),
            Some(Nccl)
        );
        assert_eq!(
            t.choice(pcie, 2, DataType::Float, &plain(16 << 10)),
            Some(Fused(Family::TwoShot)),
            "fp32's own section"
        );
        assert_eq!(t.choice(pcie, 4, DataType::Half, &plain(1024)), Some(Nccl));
        assert_eq!(
            t.choice(pcie, 8, DataType::Half, &plain(1024)),
            None,
            "no section: the built-in table"
        );
        assert_eq!(
            t.choice(LinkClass::NvLink, 2, DataType::Bf16, &plain(1024)),
            None,
            "measured on PCIe only"
        );
        assert_eq!(
            t.choice(pcie, 2, DataType::Bf16, &fused(1, 8192)),
            Some(Fused(Family::Lamport))
        );
        assert_eq!(
            t.choice(pcie, 2, DataType::Bf16, &fused(32, 8192)),
            Some(Split(Family::OneShot))
        );
        assert_eq!(
            t.choice(pcie, 2, DataType::Bf16, &fused(32, 4096)),
            Some(Fused(Family::OneShot)),
            "narrow rows: rows=any"
        );
        assert_eq!(
            t.choice(pcie, 2, DataType::Half, &fused(32, 8192)),
            Some(Fused(Family::OneShot)),
            "fp16: dtype=any"
        );
        assert_eq!(
            t.choice(pcie, 4, DataType::Half, &fused(32, 8192)),
            None,
            "no fused section at 4 ranks"
        );
    }

    /// Parses `text`, expecting a refusal of `kind` whose message says `says`.
    fn refused(text: &str, kind: TuningErrorKind, says: &str) {
        let e = Tuning::parse(text).expect_err(says);
        assert_eq!(e.kind, kind, "{e}");
        assert!(e.to_string().contains(says), "{e} should say {says:?}");
    }

    #[test]
    fn malformed_files_are_refused_by_name() {
        use TuningErrorKind::*;
        let good = sample().to_text();
        let with = |from: &str, to: &str| {
            assert!(good.contains(from), "{from}");
            good.replacen(from, to, 1)
        };
        refused("", NotTuning, "empty");
        refused("# nothing\n\n", NotTuning, "empty");
        refused("hello\n", NotTuning, "not a tuning file");
        refused(
            &with(" v1\n", " v0\n"),
            Version,
            "format v0 is an older format",
        );
        refused(
            &with(" v1\n", " v2\n"),
            Version,
            "format v2 is a newer format",
        );
        refused(&with(" v1\n", " vx\n"), Syntax, "no version number");
        refused(
            &with("machine: gpu-node-7\n", ""),
            Syntax,
            "expected the 'machine:' line, found 'driver:",
        );
        refused(
            &with("machine: gpu-node-7", "machine:"),
            Syntax,
            "'machine:' is empty",
        );
        refused(
            &with(
                "gpu: 0000:17:00.0 NVIDIA H200\ngpu: 0000:3d:00.0 NVIDIA H200\n",
                "",
            ),
            Syntax,
            "expected the 'gpu:' line",
        );
        refused(
            &with("gpu: 0000:17:00.0 NVIDIA H200", "gpu: 0000:17:00.0"),
            Syntax,
            "a PCI bus id and a name",
        );
        refused(
            &with("links: pcie", "links: infiniband"),
            Syntax,
            "not same-device, nvlink or pcie",
        );
        refused(
            &with("links: pcie", "links: no-peer"),
            Table,
            "nothing to tune",
        );
        refused(
            &with("upto=32768 lamport", "upto=32768 fastshot"),
            Syntax,
            "'fastshot' is not a way",
        );
        refused(
            &with("upto=32768 lamport", "upto=32768 fused:lamport"),
            Syntax,
            "is not a way (lamport",
        );
        refused(
            &with("upto=1048576 split:oneshot", "upto=1048576 split:fourshot"),
            Syntax,
            "not a way",
        );
        refused(
            &with("upto=1048576 split:oneshot", "upto=1048576 oneshot"),
            Syntax,
            "not a way",
        );
        refused(
            &with("upto=32768 lamport", "upto=32x68 lamport"),
            Syntax,
            "upto=32x68: not a byte count",
        );
        refused(
            &with("upto=32768 lamport", "upto=-5 lamport"),
            Syntax,
            "not a byte count",
        );
        refused(
            &with("upto=32768 lamport", "upto=0 lamport"),
            Syntax,
            "not a byte count",
        );
        refused(
            &with("upto=32768 lamport", "upto=18446744073709551615 lamport"),
            Syntax,
            "not a byte count",
        );
        refused(
            &with("upto=32768 lamport", "upto=99999999999999999999 lamport"),
            Syntax,
            "not a byte count",
        );
        refused(
            &with("upto=32768 lamport", "upto=17179869184G lamport"),
            Syntax,
            "not a byte count",
        );
        refused(
            &with("upto=32768 lamport", "upto= lamport"),
            Syntax,
            "not a byte count",
        );
        refused(
            &with(
                "plain ranks=2 dtype=any upto=32768",
                "plain ranks=two dtype=any upto=32768",
            ),
            Syntax,
            "not a rank count",
        );
        refused(
            &with(
                "plain ranks=2 dtype=any upto=32768",
                "plain ranks=3 dtype=any upto=32768",
            ),
            Table,
            "ranks=3: the kernels exist for",
        );
        refused(
            &with(
                "plain ranks=2 dtype=any upto=32768",
                "plain ranks=2 dtype=int8 upto=32768",
            ),
            Syntax,
            "dtype=int8",
        );
        refused(
            &with(
                "plain ranks=2 dtype=any upto=32768",
                "plain ranks=2 type=any upto=32768",
            ),
            Syntax,
            "expected dtype=",
        );
        refused(
            &with("rows=wide upto=16384", "rows=huge upto=16384"),
            Syntax,
            "rows=huge",
        );
        refused(
            &with("rows=wide upto=16384", "upto=16384"),
            Syntax,
            "expected 'fused ranks=... dtype=... rows=... upto=... <way>'",
        );
        refused(
            &with(
                "plain ranks=2 dtype=any upto=32768 lamport",
                "plain ranks=2 dtype=any upto=32768 lamport extra",
            ),
            Syntax,
            "expected 'plain",
        );
        refused(
            &with(
                "plain ranks=2 dtype=any upto=32768",
                "broadcast ranks=2 dtype=any upto=32768",
            ),
            Syntax,
            "is not a row",
        );
        refused(
            &with("upto=4194304 oneshot", "upto=16384 oneshot"),
            Table,
            "upto=16384 after upto=32768: the bounds must increase",
        );
        refused(
            &with("upto=4194304 oneshot", "upto=32768 oneshot"),
            Table,
            "the bounds must increase",
        );
        refused(
            &with(
                "plain ranks=4 dtype=any upto=max nccl",
                "plain ranks=4 dtype=any upto=65536 nccl",
            ),
            Table,
            "it must be upto=max",
        );
        refused(
            &with("end rows=10", "end rows=9"),
            Truncated,
            "counts 9 rows, the file has 10",
        );
        refused(
            &with("end rows=10", "end"),
            Syntax,
            "expected 'end rows=<count>'",
        );
        refused(
            &with(
                "end rows=10\n",
                "end rows=10\nplain ranks=8 dtype=any upto=max nccl\n",
            ),
            Syntax,
            "after the end line",
        );
        refused(&good.replace("end rows=10\n", ""), Truncated, "cut short");
        refused(
            &with(
                "gpu: 0000:3d:00.0 NVIDIA H200",
                "gpu: 0000:17:00.0 NVIDIA H200",
            ),
            Syntax,
            "the GPUs are listed once each, by bus id",
        );
        // A section in two places.
        let twice = good.replace(
            "end rows=10",
            "plain ranks=2 dtype=any upto=max nccl\nend rows=11",
        );
        refused(
            &twice,
            Table,
            "the rows of plain ranks=2 dtype=any are in two places (line 8) and (line 18)",
        );
    }

    /// What the loader does with a file's text on the machine of [`machine`]: parse, then check.
    fn loaded(text: &str) -> Result<Tuning, TuningError> {
        let t = Tuning::parse(text)?;
        t.check(&machine())?;
        Ok(t)
    }

    /// The fuzz: every prefix of a good file, every line deleted, doubled, swapped with the next,
    /// its numbers garbled, and lines of other versions, builds and families. Each is refused
    /// with a message (so the loader warns once and keeps the built-in tables), none panics.
    /// The one kind of change that keeps a valid file is a swap of two sections of one row
    /// each: the same tables in another order, accepted as such.
    #[test]
    fn fuzzed_files_are_all_refused() {
        let good = sample().to_text();
        let lines: Vec<&str> = good.lines().collect();
        let mut cases: Vec<(String, String)> = Vec::new();
        for cut in 0..good.len() {
            // Cut anywhere (mid-line too); only the final newline may go.
            if good.is_char_boundary(cut) && !good[cut..].trim().is_empty() {
                cases.push((format!("the first {cut} bytes"), good[..cut].to_owned()));
            }
        }
        let join = |ls: &[&str]| ls.iter().map(|l| format!("{l}\n")).collect::<String>();
        for i in 0..lines.len() {
            let mut deleted = lines.clone();
            deleted.remove(i);
            cases.push((format!("line {} deleted", i + 1), join(&deleted)));
            let mut doubled = lines.clone();
            doubled.insert(i, lines[i]);
            cases.push((format!("line {} doubled", i + 1), join(&doubled)));
            if i + 1 < lines.len() {
                let mut swapped = lines.clone();
                swapped.swap(i, i + 1);
                cases.push((
                    format!("lines {} and {} swapped", i + 1, i + 2),
                    join(&swapped),
                ));
            }
            for bad in ["x", "-1", "99999999999999999999999", ""] {
                if lines[i].contains('=') {
                    let garbled = lines[i]
                        .replace(|c: char| c.is_ascii_digit(), "")
                        .replace('=', &format!("={bad}"));
                    let mut g = lines.clone();
                    g[i] = &garbled;
                    cases.push((format!("line {} numbers as '{bad}'", i + 1), join(&g)));
                }
            }
        }
        for (from, to) in [
            (" v1\n", " v0\n"),
            (" v1\n", " v2\n"),
            ("library: ", "library: 0.0.1 EAR7 "),
            ("machine: gpu-node-7", "machine: other"),
            ("lamport", "lampord"),
            ("split:oneshot", "split:threeshot"),
            ("dtype=bf16", "dtype=bf17"),
            ("upto=32768", "upto=32768.5"),
        ] {
            cases.push((format!("'{from}' as '{to}'"), good.replacen(from, to, 1)));
        }
        let reordered = |t: &Tuning| {
            let mut a = t.sections.clone();
            let mut b = sample().sections;
            a.sort_by_key(|s| s.key.to_string());
            b.sort_by_key(|s| s.key.to_string());
            a == b && t.fingerprint() == sample().fingerprint()
        };
        let (mut refusals, mut reorders) = (0, 0);
        for (what, text) in &cases {
            let outcome = std::panic::catch_unwind(|| loaded(text))
                .unwrap_or_else(|_| panic!("{what}: the parser panicked"));
            match outcome {
                Err(e) => {
                    assert!(!e.message.is_empty(), "{what}: a refusal without a message");
                    refusals += 1;
                }
                Ok(t) => {
                    assert!(
                        what.contains("swapped") && reordered(&t),
                        "{what}: accepted:\n{text}"
                    );
                    reorders += 1;
                }
            }
        }
        assert_eq!(reorders, 1, "the two one-row sections at the end, swapped");
        assert!(
            refusals > good.len(),
            "{refusals} refusals of {} cases",
            cases.len()
        );
    }

    #[test]
    fn other_machines_and_builds_are_refused_naming_the_difference() {
        let t = sample();
        t.check(&machine()).unwrap();
        let fewer = Machine {
            gpus: machine().gpus[1..].to_vec(),
            ..machine()
        };
        t.check(&fewer)
            .expect("a process that sees fewer GPUs (CUDA_VISIBLE_DEVICES) is the same machine");
        let foreign = |m: Machine, says: &str| {
            let e = t.check(&m).expect_err(says);
            assert_eq!(e.kind, TuningErrorKind::Foreign);
            assert!(e.message.contains(says), "{e} should say {says:?}");
        };
        foreign(
            Machine {
                host: "other".into(),
                ..machine()
            },
            "measured on host 'gpu-node-7', this is 'other'",
        );
        foreign(
            Machine {
                driver: "590.1 (CUDA 13.1)".into(),
                ..machine()
            },
            "measured with driver 580.82.09 (CUDA 13.0), this machine has 590.1 (CUDA 13.1)",
        );
        let mut swapped = machine();
        swapped.gpus[0].name = "NVIDIA H100".into();
        foreign(
            swapped,
            "the GPU at 0000:17:00.0 is an NVIDIA H100 here, an NVIDIA H200 in the file",
        );
        let mut more = machine();
        more.gpus.push(Gpu {
            bus_id: "0000:9a:00.0".into(),
            name: "NVIDIA H200".into(),
        });
        foreign(
            more,
            "GPU 0000:9a:00.0 (NVIDIA H200) is not among the file's GPUs",
        );
        let both = Machine {
            host: "other".into(),
            driver: "x".into(),
            ..machine()
        };
        let e = t.check(&both).unwrap_err();
        assert!(
            e.message.contains("host") && e.message.contains("driver"),
            "every difference named: {e}"
        );
        let old = Tuning {
            library: "0.0.9 EAR7".into(),
            ..sample()
        };
        let e = old.check(&machine()).unwrap_err();
        assert_eq!(e.kind, TuningErrorKind::Library);
        assert!(
            e.message.contains(&format!(
                "measured with library 0.0.9 EAR7, this is {}",
                library_id()
            )),
            "{e}"
        );
    }

    #[test]
    fn the_loader_reports_and_falls_back() {
        let dir = std::env::temp_dir().join(format!("ear-tuning-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILE_NAME);
        let here = || Ok(machine());
        // The default place, no file: nothing to say.
        let _ = std::fs::remove_file(&path);
        assert_eq!(load(&path, false, here), Ok(None));
        // Named by the environment but missing: a warning.
        let e = load(&path, true, here).unwrap_err();
        assert_eq!(e.kind, TuningErrorKind::Io);
        assert!(e.message.contains("cannot read it"), "{e}");
        std::fs::write(&path, sample().to_text()).unwrap();
        assert_eq!(load(&path, false, here), Ok(Some(sample())));
        let e = load(&path, false, || Err("no driver".to_owned())).unwrap_err();
        assert!(
            e.message
                .contains("cannot tell which machine this is (no driver)"),
            "{e}"
        );
        let e = load(&path, false, || {
            Ok(Machine {
                host: "x".into(),
                ..machine()
            })
        })
        .unwrap_err();
        assert_eq!(e.kind, TuningErrorKind::Foreign);
        std::fs::write(&path, &sample().to_text()[..200]).unwrap();
        assert!(load(&path, false, here).is_err());
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        assert!(load(&path, false, here)
            .unwrap_err()
            .message
            .contains("not UTF-8"));
        std::fs::write(&path, vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).unwrap();
        assert!(load(&path, false, here)
            .unwrap_err()
            .message
            .contains("larger than any tuning file"));
        assert!(load(&dir, true, here).is_err(), "a directory");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn small_pieces() {
        assert_eq!(driver_description(13000, Some("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.09  Wed Aug 20 2025\nGCC version: gcc 12\n")), "580.82.09 (CUDA 13.0)");
        assert_eq!(driver_description(12080, Some("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build\n")), "570.124.06 (CUDA 12.8)");
        assert_eq!(driver_description(13010, None), "CUDA 13.1");
        assert_eq!(driver_description(13000, Some("garbage")), "CUDA 13.0");
        assert_eq!(one_line(" a\nb\t "), "a b");
        assert_eq!(parse_bound("2M"), Some(2 << 20));
        assert_eq!(parse_bound("max"), Some(u64::MAX));
        assert_eq!(parse_bound("M"), None);
        assert_eq!(parse_bound("1.5M"), None);
        assert_eq!(RowWidth::of(NARROW_ROW), RowWidth::Narrow);
        assert_eq!(RowWidth::of(NARROW_ROW + 1), RowWidth::Wide);
        assert!(
            library_id().starts_with(env!("CARGO_PKG_VERSION")) && library_id().contains(" EAR"),
            "{}",
            library_id()
        );
        let empty = Tuning {
            sections: Vec::new(),
            ..sample()
        };
        assert!(empty
            .validate()
            .unwrap_err()
            .message
            .contains("no table rows"));
        let mut split_plain = sample();
        split_plain.sections[0].rows[0].1 = FusedChoice::Split(Family::OneShot);
        assert!(split_plain
            .validate()
            .unwrap_err()
            .message
            .contains("only the fused op splits"));
        let mut keyless = sample();
        keyless.sections[0].key.width = Some(RowWidth::Any);
        assert!(keyless
            .validate()
            .unwrap_err()
            .message
            .contains("a fused section has a rows= class"));
    }
}
