//! `edgellm-allreduce-bench probe`: what a link gives the SMs (issue 41: the PCIe physics of the
//! machines at hand). SM stores and SM loads across the link (`kernels/probe.cu` through
//! `edgellm_allreduce::probe`), bandwidth against CTA count, transfer size and one or both
//! directions; the copy engines' copies over the same link; the round trip of one load and of
//! one store made visible. Two modes:
//! - `host`: a GPU against pinned host memory (mapped, `cuMemHostAlloc`) over the GPU's own PCIe
//!   link: posted writes and non-posted reads cross the same kind of link as PCIe peer-to-peer,
//!   but this is not GPU-to-GPU, and every line says so;
//! - `peers`: every ordered pair of GPUs with peer access, the first GPU's kernels pushing into
//!   and pulling from the second's memory.
//!
//! This file holds what needs no GPU (options, the sweep, rows, the table, the CSV, the PCIe link
//! read from sysfs); [`run`] measures.

mod run;

pub use run::run;

use crate::stats::{fmt_bytes, parse_bytes, Summary};
use clap::{Args, ValueEnum};
use edgellm_allreduce::probe::RoundTrip;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// host: each GPU against pinned host memory over its PCIe link (not GPU-to-GPU); peers:
    /// every ordered pair of GPUs with peer access [peers when 2+ GPUs are visible, else host].
    #[arg(long, value_enum)]
    pub mode: Option<LinkMode>,
    /// The GPUs, comma-separated [host: 0; peers: every visible GPU].
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<i32>,
    /// CTAs of the SM copies, each capped at the SM count [1,2,4,8,16,32,64,132; --quick: 1,8,132].
    #[arg(long, value_delimiter = ',')]
    pub ctas: Vec<u32>,
    /// Transfer sizes, rounded up to 16 bytes (K, M, G: powers of 1024) [64K,1M,16M; --quick: 64K,16M].
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes)]
    pub sizes: Vec<u64>,
    /// write: stores over the link; read: loads over it; both: host mode a write and a read at
    /// once, peers mode the two GPUs writing into each other at once [write,read,both]. Without
    /// read, no load crosses the link in peers mode.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub directions: Vec<Direction>,
    /// Skip the copy-engine copies (cuMemcpyAsync, cuMemcpyPeerAsync).
    #[arg(long)]
    pub no_copy_engine: bool,
    /// Skip the round trips (load, store + fence).
    #[arg(long)]
    pub no_latency: bool,
    /// Timed repeats of each line; the median is over them [7; --quick: 3].
    #[arg(long)]
    pub repeats: Option<u32>,
    /// Round trips per latency repeat [1000; --quick: 200].
    #[arg(long)]
    pub iters: Option<u32>,
    /// A reduced sweep (about 10 s on a GPU).
    #[arg(long)]
    pub quick: bool,
    /// CSV output, one row per line of the table.
    #[arg(long, default_value = "probe.csv")]
    pub csv: PathBuf,
    /// Seconds any one wait for the GPU may take; then the probe reports it and exits (3),
    /// leaving the memory that a kernel still running may touch.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LinkMode {
    Host,
    Peers,
}

impl LinkMode {
    pub fn name(self) -> &'static str {
        match self {
            LinkMode::Host => "host",
            LinkMode::Peers => "peers",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Direction {
    Write,
    Read,
    Both,
}

impl Direction {
    const ALL: [Direction; 3] = [Direction::Write, Direction::Read, Direction::Both];
}

pub const DEFAULT_CTAS: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 132];
const QUICK_CTAS: [u32; 3] = [1, 8, 132];
const DEFAULT_SIZES: [u64; 3] = [64 << 10, 1 << 20, 16 << 20];
const QUICK_SIZES: [u64; 2] = [64 << 10, 16 << 20];

/// What a run measures (the options resolved against the machine).
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    pub mode: LinkMode,
    pub devices: Vec<i32>,
    pub ctas: Vec<u32>,
    pub sizes: Vec<u64>,
    pub directions: Vec<Direction>,
    pub copy_engine: bool,
    pub latency: bool,
    pub repeats: u32,
    pub iters: u32,
    /// Bytes each timed SM repeat moves per direction (its launch copies the transfer this many
    /// bytes' worth of times), so that a launch's own cost stays out of the figure.
    pub target_bytes: u64,
    pub timeout: Duration,
}

/// One line of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// SM copies by `ctas` CTAs, `bytes` per transfer.
    Sm { direction: Direction, bytes: u64, ctas: u32 },
    /// Copy-engine copies of `bytes`.
    Ce { direction: Direction, bytes: u64 },
    /// One thread's dependent round trips.
    Latency(RoundTrip),
}

impl Measure {
    pub fn name(self) -> &'static str {
        match self {
            Measure::Sm { direction: Direction::Write, .. } => "sm_write",
            Measure::Sm { direction: Direction::Read, .. } => "sm_read",
            Measure::Sm { direction: Direction::Both, .. } => "sm_both",
            Measure::Ce { direction: Direction::Write, .. } => "ce_write",
            Measure::Ce { direction: Direction::Read, .. } => "ce_read",
            Measure::Ce { direction: Direction::Both, .. } => "ce_both",
            Measure::Latency(RoundTrip::Load) => "lat_load",
            Measure::Latency(RoundTrip::StoreFence) => "lat_store",
        }
    }

    fn bytes(self) -> Option<u64> {
        match self {
            Measure::Sm { bytes, .. } | Measure::Ce { bytes, .. } => Some(bytes),
            Measure::Latency(_) => None,
        }
    }

    fn ctas(self) -> Option<u32> {
        match self {
            Measure::Sm { ctas, .. } => Some(ctas),
            _ => None,
        }
    }

    /// GB/s for transfers, µs for round trips.
    pub fn unit(self) -> &'static str {
        match self {
            Measure::Latency(_) => "us",
            _ => "GB/s",
        }
    }

    /// Whether it reads across the link (what may never come back over a broken fabric): in host
    /// mode `both` is a write and a read; in peers mode two writes.
    pub fn reads(self, mode: LinkMode) -> bool {
        match self {
            Measure::Sm { direction, .. } | Measure::Ce { direction, .. } => {
                direction == Direction::Read || (direction == Direction::Both && mode == LinkMode::Host)
            }
            Measure::Latency(trip) => trip == RoundTrip::Load,
        }
    }
}

impl ProbeArgs {
    /// The mode asked for, else peers when `gpus` can form a pair.
    pub fn mode(&self, gpus: i32) -> LinkMode {
        self.mode.unwrap_or(if gpus >= 2 { LinkMode::Peers } else { LinkMode::Host })
    }

    /// The GPUs `mode` probes on a machine of `gpus` GPUs.
    pub fn devices(&self, mode: LinkMode, gpus: i32) -> Result<Vec<i32>, String> {
        let mut devices = match (self.devices.is_empty(), mode) {
            (false, _) => self.devices.clone(),
            (true, LinkMode::Host) => vec![0],
            (true, LinkMode::Peers) => (0..gpus).collect(),
        };
        if let Some(bad) = devices.iter().find(|&&d| d < 0 || d >= gpus) {
            return Err(format!("--devices {bad}: this machine has {gpus} GPU(s)"));
        }
        devices.sort_unstable();
        devices.dedup();
        if mode == LinkMode::Peers && devices.len() < 2 {
            return Err(format!("peers mode needs 2 or more GPUs; {} visible (use --mode host)", devices.len()));
        }
        Ok(devices)
    }

    /// The sweep on `devices`, whose smallest SM count is `sms`.
    pub fn resolve(&self, mode: LinkMode, devices: Vec<i32>, sms: u32) -> Result<Sweep, String> {
        let quick = self.quick;
        let ctas: &[u32] = match (self.ctas.is_empty(), quick) {
            (false, _) => &self.ctas,
            (true, false) => &DEFAULT_CTAS,
            (true, true) => &QUICK_CTAS,
        };
        if ctas.contains(&0) {
            return Err("--ctas: a CTA count must be 1 or more".into());
        }
        let mut ctas: Vec<u32> = ctas.iter().map(|&c| c.min(sms.max(1))).collect();
        ctas.sort_unstable();
        ctas.dedup();
        let sizes: &[u64] = match (self.sizes.is_empty(), quick) {
            (false, _) => &self.sizes,
            (true, false) => &DEFAULT_SIZES,
            (true, true) => &QUICK_SIZES,
        };
        let mut sizes: Vec<u64> = sizes.iter().map(|s| s.div_ceil(16) * 16).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let directions: Vec<Direction> =
            Direction::ALL.into_iter().filter(|d| self.directions.is_empty() || self.directions.contains(d)).collect();
        let (repeats, iters) =
            (self.repeats.unwrap_or(if quick { 3 } else { 7 }), self.iters.unwrap_or(if quick { 200 } else { 1000 }));
        if repeats == 0 || iters == 0 {
            return Err("--repeats and --iters must be 1 or more".into());
        }
        Ok(Sweep {
            mode,
            devices,
            ctas,
            sizes,
            directions,
            copy_engine: !self.no_copy_engine,
            latency: !self.no_latency,
            repeats,
            iters,
            target_bytes: if quick { 64 << 20 } else { 256 << 20 },
            timeout: Duration::from_secs(self.timeout.max(1)),
        })
    }
}

impl Sweep {
    /// Every line of one link, in the table's order. `both`: whether this link runs the `both`
    /// lines (a pair of GPUs runs them once, not once per order).
    pub fn measures(&self, both: bool) -> Vec<Measure> {
        let directions: Vec<Direction> =
            self.directions.iter().copied().filter(|&d| both || d != Direction::Both).collect();
        let mut out = Vec::new();
        for &direction in &directions {
            for &bytes in &self.sizes {
                out.extend(self.ctas.iter().map(|&ctas| Measure::Sm { direction, bytes, ctas }));
            }
        }
        if self.copy_engine {
            for &direction in &directions {
                out.extend(self.sizes.iter().map(|&bytes| Measure::Ce { direction, bytes }));
            }
        }
        if self.latency {
            if self.directions.contains(&Direction::Read) {
                out.push(Measure::Latency(RoundTrip::Load));
            }
            if self.directions.contains(&Direction::Write) {
                out.push(Measure::Latency(RoundTrip::StoreFence));
            }
        }
        out
    }

    /// SM copies of a timed repeat: enough to move [`Sweep::target_bytes`].
    pub fn reps(&self, bytes: u64) -> u64 {
        self.target_bytes.div_ceil(bytes).max(1)
    }

    /// Copy-engine copies of a timed repeat (each its own call, all queued before the start:
    /// at most [`CE_MAX_CALLS`]).
    pub fn ce_calls(&self, bytes: u64) -> u32 {
        self.target_bytes.div_ceil(bytes).clamp(1, CE_MAX_CALLS as u64) as u32
    }
}

/// Copy-engine calls queued behind one start gate (below the gate's limit, `gpu::GATE_MAX_CALLS`).
pub const CE_MAX_CALLS: u32 = 64;

/// What a line crosses: from a GPU to pinned host memory, or to another GPU's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Host,
    Gpu(i32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    /// The GPU whose SMs (or copy engine) do the work.
    pub from: i32,
    pub to: Target,
}

impl Link {
    fn target(self) -> String {
        match self.to {
            Target::Host => "host".into(),
            Target::Gpu(d) => format!("gpu{d}"),
        }
    }
}

/// One measured line.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub link: Link,
    pub measure: Measure,
    /// GB/s (transfers) or µs (round trips): median, p10, p90 over the repeats.
    pub value: Summary,
}

/// The title of a link, with what `gpu` says of each GPU ("NVIDIA H100 80GB HBM3, 0000:19:00.0").
pub fn link_title(link: Link, gpu: &dyn Fn(i32) -> String, peer_class: Option<&str>) -> String {
    match link.to {
        Target::Host => {
            format!("GPU {} ({}) <-> pinned host memory over PCIe (not GPU-to-GPU)", link.from, gpu(link.from))
        }
        Target::Gpu(b) => format!(
            "GPU {} ({}) -> GPU {b} ({}), peer-to-peer{}",
            link.from,
            gpu(link.from),
            gpu(b),
            peer_class.map(|c| format!(" over {c} (the driver's class)")).unwrap_or_default()
        ),
    }
}

/// The table's line of `row`.
pub fn line(row: &Row) -> String {
    let m = row.measure;
    let size = m.bytes().map(fmt_bytes).unwrap_or_default();
    let ctas = m.ctas().map(|c| format!("{c} CTA{}", if c == 1 { "" } else { "s" })).unwrap_or_default();
    let v = row.value;
    let value = match m {
        Measure::Latency(_) => format!("{:>9.3} µs   (p10 {:.3}, p90 {:.3})", v.median, v.p10, v.p90),
        _ => format!("{:>9.2} GB/s (p10 {:.2}, p90 {:.2})", v.median, v.p10, v.p90),
    };
    format!("  {:<9} {:>8} {:>8}  {value}", m.name(), size, ctas)
}

/// One row of the CSV.
#[derive(Debug, Serialize)]
pub struct CsvRow {
    pub mode: &'static str,
    pub initiator: String,
    pub target: String,
    pub measure: &'static str,
    pub bytes: Option<u64>,
    pub ctas: Option<u32>,
    pub median: String,
    pub p10: String,
    pub p90: String,
    pub unit: &'static str,
    pub repeats: u32,
}

impl CsvRow {
    pub fn new(mode: LinkMode, row: &Row, repeats: u32) -> CsvRow {
        let m = row.measure;
        let f = |v: f64| format!("{v:.3}");
        CsvRow {
            mode: mode.name(),
            initiator: format!("gpu{}", row.link.from),
            target: row.link.target(),
            measure: m.name(),
            bytes: m.bytes(),
            ctas: m.ctas(),
            median: f(row.value.median),
            p10: f(row.value.p10),
            p90: f(row.value.p90),
            unit: m.unit(),
            repeats,
        }
    }
}

/// The summary of one link's rows: the best median of each transfer line (and where: size,
/// CTAs), the round trips. A best figure above `limit` of its line (host mode: the PCIe link's
/// raw rate, twice that for `both`) is marked: not all of it can have crossed the link.
pub fn summary(rows: &[Row], limit: &dyn Fn(Measure) -> Option<f64>) -> String {
    let mut out = String::new();
    let mut names: Vec<&str> = rows.iter().map(|r| r.measure.name()).collect();
    names.dedup();
    for name in names {
        let of: Vec<&Row> = rows.iter().filter(|r| r.measure.name() == name).collect();
        let Some(best) = of.iter().copied().max_by(|a, b| a.value.median.total_cmp(&b.value.median)) else {
            continue;
        };
        let m = best.measure;
        if let Measure::Latency(_) = m {
            let _ = writeln!(out, "  {name:<9} {:.3} µs per round trip", best.value.median);
            continue;
        }
        let at = match (m.bytes(), m.ctas()) {
            (Some(b), Some(c)) => format!("at {}, {c} CTA{}", fmt_bytes(b), if c == 1 { "" } else { "s" }),
            (Some(b), None) => format!("at {}", fmt_bytes(b)),
            _ => String::new(),
        };
        let mark = match limit(m) {
            Some(l) if best.value.median > l => {
                format!("  ! above the link's {l:.1} GB/s: not all of it crossed the link")
            }
            _ => String::new(),
        };
        let _ = writeln!(out, "  {name:<9} best {:.2} GB/s {at}{mark}", best.value.median);
    }
    out
}

/// One row of a probe CSV as read back (`CsvRow`'s columns; others are ignored).
#[derive(Debug, serde::Deserialize)]
struct CsvLine {
    mode: String,
    initiator: String,
    target: String,
    measure: String,
    bytes: Option<u64>,
    ctas: Option<u32>,
    median: f64,
}

/// The transfer lines a CSV summary names, best figure first: SM and copy-engine writes, reads
/// and both directions at once.
const TRANSFERS: [&str; 6] = ["sm_write", "sm_read", "sm_both", "ce_write", "ce_read", "ce_both"];

/// A probe CSV (`probe --csv`) in a few lines, one per link (initiator -> target, in the CSV's
/// order): each transfer line's best GB/s with its size and CTAs, and the round trips (µs,
/// the best repeat median). For `tune`'s report.
pub fn csv_summary(text: &str) -> Result<Vec<String>, String> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let rows: Vec<CsvLine> = reader
        .deserialize()
        .enumerate()
        .map(|(i, r)| r.map_err(|e| format!("line {}: {e}", i + 2)))
        .collect::<Result<_, _>>()?;
    let mut links: Vec<(&str, &str, &str)> = Vec::new();
    for r in &rows {
        let link = (r.mode.as_str(), r.initiator.as_str(), r.target.as_str());
        if !links.contains(&link) {
            links.push(link);
        }
    }
    let mut out = Vec::new();
    for (mode, from, to) in links {
        let of = |name: &'static str| {
            rows.iter()
                .filter(move |r| (r.mode.as_str(), r.initiator.as_str(), r.target.as_str()) == (mode, from, to))
                .filter(move |r| r.measure == name && r.median.is_finite())
        };
        let mut parts = Vec::new();
        for name in TRANSFERS {
            if let Some(best) = of(name).max_by(|a, b| a.median.total_cmp(&b.median)) {
                let at = match (best.bytes, best.ctas) {
                    (Some(b), Some(c)) => format!(" ({}, {c} CTAs)", fmt_bytes(b)),
                    (Some(b), None) => format!(" ({})", fmt_bytes(b)),
                    _ => String::new(),
                };
                parts.push(format!("{name} {:.1} GB/s{at}", best.median));
            }
        }
        for name in ["lat_load", "lat_store"] {
            if let Some(best) = of(name).min_by(|a, b| a.median.total_cmp(&b.median)) {
                parts.push(format!("{name} {:.2} us", best.median));
            }
        }
        out.push(format!("{from} -> {to} ({mode}): {}", parts.join(", ")));
    }
    Ok(out)
}

/// sysfs's name of a PCI device (`0000:19:00.0`) from the driver's (`0000:19:00.0`,
/// `00000000:19:00.0`, upper or lower case).
pub fn sysfs_bus_id(driver: &str) -> Option<String> {
    let (domain, rest) = driver.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

/// A PCIe link as sysfs says it: `current_link_speed` ("32.0 GT/s PCIe") and width ("16").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PcieLink {
    pub gts: f64,
    pub width: u32,
}

impl PcieLink {
    pub fn parse(speed: &str, width: &str) -> Option<PcieLink> {
        let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
        let width: u32 = width.trim().parse().ok()?;
        (gts > 0.0 && width > 0).then_some(PcieLink { gts, width })
    }

    /// The generation of its rate (2.5 GT/s: 1 ... 64 GT/s: 6).
    pub fn generation(self) -> Option<u32> {
        [2.5, 5.0, 8.0, 16.0, 32.0, 64.0].iter().position(|&g| (self.gts - g).abs() < 0.1).map(|i| i as u32 + 1)
    }

    /// The raw rate of one direction, GB/s: lanes times the transfer rate less the line code
    /// (8b/10b to Gen 2, 128b/130b to Gen 5, Gen 6's FLITs 242/256), before packet headers.
    pub fn raw_gbps(self) -> f64 {
        let code = match self.generation() {
            Some(1 | 2) => 0.8,
            Some(6) => 242.0 / 256.0,
            _ => 128.0 / 130.0,
        };
        self.gts * self.width as f64 * code / 8.0
    }

    pub fn describe(self) -> String {
        match self.generation() {
            Some(g) => format!("Gen{g} x{}", self.width),
            None => format!("{} GT/s x{}", self.gts, self.width),
        }
    }
}

/// The current and maximal PCIe link of the device at `bus_id` (sysfs), when readable.
pub fn pcie_link(bus_id: &str) -> Option<(PcieLink, Option<PcieLink>)> {
    let dir = format!("/sys/bus/pci/devices/{}", sysfs_bus_id(bus_id)?);
    let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
    let current = PcieLink::parse(&read("current_link_speed")?, &read("current_link_width")?)?;
    let max = read("max_link_speed").zip(read("max_link_width")).and_then(|(s, w)| PcieLink::parse(&s, &w));
    Some((current, max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        probe: ProbeArgs,
    }

    fn args(line: &str) -> ProbeArgs {
        Cli::try_parse_from(std::iter::once("probe").chain(line.split_whitespace())).expect("parses").probe
    }

    #[test]
    fn options_parse() {
        let a = args(
            "--mode peers --devices 0,2 --ctas 1,4 --sizes 4K,1M --directions write,both --no-latency --csv x.csv",
        );
        assert_eq!(a.mode, Some(LinkMode::Peers));
        assert_eq!((a.devices, a.ctas), (vec![0, 2], vec![1, 4]));
        assert_eq!(a.sizes, vec![4096, 1 << 20]);
        assert_eq!(a.directions, vec![Direction::Write, Direction::Both]);
        assert!(a.no_latency && !a.no_copy_engine && a.csv.as_path() == std::path::Path::new("x.csv"));
        assert!(Cli::try_parse_from(["probe", "--directions", "sideways"]).is_err());
        assert!(Cli::try_parse_from(["probe", "--sizes", "4Q"]).is_err());
    }

    #[test]
    fn the_mode_and_devices_follow_the_machine() {
        let a = args("");
        assert_eq!(a.mode(1), LinkMode::Host);
        assert_eq!(a.mode(2), LinkMode::Peers);
        assert_eq!(args("--mode host").mode(8), LinkMode::Host);
        assert_eq!(a.devices(LinkMode::Host, 4).unwrap(), vec![0]);
        assert_eq!(a.devices(LinkMode::Peers, 3).unwrap(), vec![0, 1, 2]);
        assert!(a.devices(LinkMode::Peers, 1).unwrap_err().contains("2 or more"));
        assert!(args("--devices 0,4").devices(LinkMode::Peers, 4).unwrap_err().contains("--devices 4"));
        assert_eq!(args("--devices 1").devices(LinkMode::Host, 2).unwrap(), vec![1]);
        assert_eq!(args("--devices 2,0,2").devices(LinkMode::Peers, 4).unwrap(), vec![0, 2]);
        assert!(args("--devices 1,1").devices(LinkMode::Peers, 2).is_err(), "one GPU twice is no pair");
    }

    #[test]
    fn the_default_sweep() {
        let s = args("").resolve(LinkMode::Host, vec![0], 132).unwrap();
        assert_eq!(s.ctas, DEFAULT_CTAS);
        assert_eq!(s.sizes, DEFAULT_SIZES);
        assert_eq!(s.directions, Direction::ALL);
        assert!(s.copy_engine && s.latency && s.repeats == 7 && s.iters == 1000);
        let m = s.measures(true);
        // 3 directions x 3 sizes x 8 CTA counts, 3 x 3 copy-engine lines, 2 round trips.
        assert_eq!(m.len(), 72 + 9 + 2);
        assert_eq!(m[0], Measure::Sm { direction: Direction::Write, bytes: 64 << 10, ctas: 1 });
        assert_eq!(m[71], Measure::Sm { direction: Direction::Both, bytes: 16 << 20, ctas: 132 });
        assert_eq!(m[72], Measure::Ce { direction: Direction::Write, bytes: 64 << 10 });
        assert_eq!(m[81..], [Measure::Latency(RoundTrip::Load), Measure::Latency(RoundTrip::StoreFence)]);
        assert_eq!(s.measures(false).len(), 48 + 6 + 2, "a pair's second order runs no both lines");
        assert_eq!((s.reps(64 << 10), s.reps(16 << 20), s.reps(1 << 30)), (4096, 16, 1));
        assert_eq!((s.ce_calls(64 << 10), s.ce_calls(16 << 20)), (CE_MAX_CALLS, 16));
    }

    #[test]
    fn ctas_are_capped_at_the_sm_count_and_sizes_at_16_bytes() {
        let s = args("").resolve(LinkMode::Host, vec![0], 70).unwrap();
        assert_eq!(s.ctas, [1, 2, 4, 8, 16, 32, 64, 70]);
        let s = args("--ctas 200,132,1 --sizes 1000,1K,1M").resolve(LinkMode::Host, vec![0], 132).unwrap();
        assert_eq!((s.ctas, s.sizes), (vec![1, 132], vec![1008, 1024, 1 << 20]));
        assert!(args("--ctas 0").resolve(LinkMode::Host, vec![0], 132).is_err());
        assert!(args("--repeats 0").resolve(LinkMode::Host, vec![0], 132).is_err());
    }

    #[test]
    fn the_quick_sweep_is_small() {
        let s = args("--quick").resolve(LinkMode::Host, vec![0], 132).unwrap();
        assert_eq!((s.ctas.as_slice(), s.sizes.as_slice()), (&QUICK_CTAS[..], &QUICK_SIZES[..]));
        assert_eq!((s.repeats, s.iters, s.target_bytes), (3, 200, 64 << 20));
        assert_eq!(s.measures(true).len(), 18 + 6 + 2);
    }

    #[test]
    fn directions_choose_lines_and_which_of_them_read() {
        let s = args("--directions write,both").resolve(LinkMode::Peers, vec![0, 1], 132).unwrap();
        let m = s.measures(true);
        assert!(m.iter().all(|m| m.name() != "sm_read" && m.name() != "ce_read" && m.name() != "lat_load"));
        assert!(m.contains(&Measure::Latency(RoundTrip::StoreFence)));
        assert!(m.iter().all(|m| !m.reads(LinkMode::Peers)), "peers: write and both never load across the link");
        let both = Measure::Sm { direction: Direction::Both, bytes: 16, ctas: 1 };
        assert!(both.reads(LinkMode::Host) && !both.reads(LinkMode::Peers));
        assert!(Measure::Ce { direction: Direction::Read, bytes: 16 }.reads(LinkMode::Peers));
        assert!(Measure::Latency(RoundTrip::Load).reads(LinkMode::Host));
        let reads = args("--directions read --no-copy-engine").resolve(LinkMode::Host, vec![0], 132).unwrap();
        assert_eq!(reads.measures(true).len(), 24 + 1);
    }

    fn row(measure: Measure, median: f64) -> Row {
        Row {
            link: Link { from: 0, to: Target::Host },
            measure,
            value: Summary { median, p10: median * 0.9, p90: median * 1.1 },
        }
    }

    #[test]
    fn lines_csv_rows_and_the_summary() {
        let w = |bytes, ctas| Measure::Sm { direction: Direction::Write, bytes, ctas };
        let rows = [
            row(w(1 << 20, 1), 10.0),
            row(w(16 << 20, 8), 52.5),
            row(Measure::Ce { direction: Direction::Read, bytes: 16 << 20 }, 53.0),
            row(Measure::Latency(RoundTrip::Load), 1.25),
        ];
        assert_eq!(line(&rows[1]), "  sm_write    16 MiB   8 CTAs      52.50 GB/s (p10 47.25, p90 57.75)");
        assert_eq!(line(&rows[2]), "  ce_read     16 MiB               53.00 GB/s (p10 47.70, p90 58.30)");
        assert_eq!(line(&rows[3]), "  lat_load                         1.250 µs   (p10 1.125, p90 1.375)");
        let s = summary(&rows, &|_| Some(63.0));
        assert_eq!(
            s,
            "  sm_write  best 52.50 GB/s at 16 MiB, 8 CTAs\n  ce_read   best 53.00 GB/s at 16 MiB\n  lat_load  1.250 µs per round trip\n"
        );
        let marked = summary(&rows, &|m| (m.name() == "ce_read").then_some(50.0));
        assert!(marked.contains("ce_read   best 53.00 GB/s at 16 MiB  ! above the link's 50.0 GB/s"));
        assert!(!marked.contains("52.50 GB/s at 16 MiB, 8 CTAs  !"));

        let mut w = csv::Writer::from_writer(Vec::new());
        for r in &rows[1..] {
            w.serialize(CsvRow::new(LinkMode::Host, r, 7)).unwrap();
        }
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "mode,initiator,target,measure,bytes,ctas,median,p10,p90,unit,repeats");
        assert_eq!(lines[1], "host,gpu0,host,sm_write,16777216,8,52.500,47.250,57.750,GB/s,7");
        assert_eq!(lines[2], "host,gpu0,host,ce_read,16777216,,53.000,47.700,58.300,GB/s,7");
        assert_eq!(lines[3], "host,gpu0,host,lat_load,,,1.250,1.125,1.375,us,7");
    }

    #[test]
    fn a_csv_in_a_few_lines() {
        let text = "mode,initiator,target,measure,bytes,ctas,median,p10,p90,unit,repeats\n\
            peers,gpu0,gpu1,sm_write,65536,1,20.000,19,21,GB/s,7\n\
            peers,gpu0,gpu1,sm_write,16777216,8,52.500,50,53,GB/s,7\n\
            peers,gpu0,gpu1,sm_read,16777216,132,42.800,40,43,GB/s,7\n\
            peers,gpu0,gpu1,ce_write,16777216,,50.100,49,51,GB/s,7\n\
            peers,gpu0,gpu1,lat_load,,,1.250,1.1,1.3,us,7\n\
            peers,gpu0,gpu1,lat_store,,,0.680,0.6,0.7,us,7\n\
            peers,gpu1,gpu0,sm_write,16777216,8,51.000,50,52,GB/s,7\n";
        assert_eq!(
            csv_summary(text).unwrap(),
            [
                "gpu0 -> gpu1 (peers): sm_write 52.5 GB/s (16 MiB, 8 CTAs), sm_read 42.8 GB/s (16 MiB, 132 CTAs), \
                 ce_write 50.1 GB/s (16 MiB), lat_load 1.25 us, lat_store 0.68 us",
                "gpu1 -> gpu0 (peers): sm_write 51.0 GB/s (16 MiB, 8 CTAs)",
            ]
        );
        assert!(csv_summary("mode,initiator\nhost,gpu0\n").is_err(), "not a probe CSV");
        assert_eq!(csv_summary("mode,initiator,target,measure,bytes,ctas,median,p10,p90,unit,repeats\n"), Ok(vec![]));
    }

    #[test]
    fn titles_say_what_the_link_is() {
        let gpu = |d: i32| format!("G{d}, 0000:0{d}:00.0");
        let host = link_title(Link { from: 0, to: Target::Host }, &gpu, None);
        assert_eq!(host, "GPU 0 (G0, 0000:00:00.0) <-> pinned host memory over PCIe (not GPU-to-GPU)");
        let peer = link_title(Link { from: 1, to: Target::Gpu(0) }, &gpu, Some("PCIe"));
        assert_eq!(
            peer,
            "GPU 1 (G1, 0000:01:00.0) -> GPU 0 (G0, 0000:00:00.0), peer-to-peer over PCIe (the driver's class)"
        );
    }

    #[test]
    fn pcie_links_from_sysfs() {
        assert_eq!(sysfs_bus_id("0000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(sysfs_bus_id("00000001:C1:00.0").as_deref(), Some("0001:c1:00.0"));
        assert_eq!(sysfs_bus_id("nonsense"), None);
        let gen5 = PcieLink::parse("32.0 GT/s PCIe\n", "16\n").unwrap();
        assert_eq!((gen5.generation(), gen5.describe()), (Some(5), "Gen5 x16".to_owned()));
        assert!((gen5.raw_gbps() - 63.015).abs() < 0.01);
        let gen1 = PcieLink::parse("2.5 GT/s PCIe", "8").unwrap();
        assert_eq!((gen1.generation(), gen1.raw_gbps()), (Some(1), 2.0));
        assert_eq!(PcieLink::parse("Unknown", "16"), None);
        assert_eq!(PcieLink::parse("8.0 GT/s PCIe", "0"), None);
        assert_eq!(PcieLink::parse("20.0 GT/s", "4").unwrap().describe(), "20 GT/s x4");
    }
}
