//! Results: one [`Record`] per (mode, ranks, dtype, bytes, strategy), and for the fused sweep
//! per (mode, ranks, dtype, shape, strategy); the CSV file (written as the run goes, read back
//! by the `plot` and `table` subcommands) and the text table.

use crate::stats::{busbw_gbps, fmt_bytes, sim_rank_bytes};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// Timed, and every correctness check passed.
    #[serde(rename = "ok")]
    Ok,
    /// A correctness check failed (the note says which and how).
    #[serde(rename = "FAILED")]
    Failed,
    /// The row cannot run at this size (not served, no NCCL, ...); the note says why.
    #[serde(rename = "n/a")]
    NotApplicable,
    /// A CUDA / NCCL / library error; the note holds it.
    #[serde(rename = "error")]
    Error,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "FAILED",
            Status::NotApplicable => "n/a",
            Status::Error => "error",
        }
    }
}

/// Strategy names of the two extra rows of a simulation group.
pub const FLOOR: &str = "floor";
pub const COPY: &str = "copy";

/// One row of the CSV; the columns are the fields, in order (`shape`, `graph_ops` and
/// `rank_bytes`, the last three, may be missing from older files).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub mode: String,
    pub ranks: i32,
    pub dtype: String,
    pub bytes: u64,
    pub strategy: String,
    /// What ran: the family AUTO or the plugin picked, or the row's own path.
    pub path: String,
    pub status: Status,
    /// Per-call time of graph replay (µs): median, 10th and 90th percentile over the batches.
    #[serde(serialize_with = "decimals3")]
    pub median_us: Option<f64>,
    #[serde(serialize_with = "decimals3")]
    pub p10_us: Option<f64>,
    #[serde(serialize_with = "decimals3")]
    pub p90_us: Option<f64>,
    /// Per-call time of eager launches (µs), median over the batches.
    #[serde(serialize_with = "decimals3")]
    pub eager_us: Option<f64>,
    #[serde(rename = "algbw_GBps", serialize_with = "decimals3")]
    pub algbw_gbps: Option<f64>,
    #[serde(rename = "busbw_GBps", serialize_with = "decimals3")]
    pub busbw_gbps: Option<f64>,
    /// Simulation only: N·rank_bytes/t over the copy roofline of the run (the time the path's
    /// memory traffic takes at the roofline, over the time measured).
    #[serde(serialize_with = "decimals4")]
    pub roof_frac: Option<f64>,
    pub replays: u32,
    pub batches: u32,
    pub device: String,
    pub note: String,
    /// Fused rows: the shape, "8x4096" or "8x4096+bias" (tokens x hidden, with a bias input);
    /// empty for plain rows. `bytes` is then tokens · hidden · element size.
    #[serde(default)]
    pub shape: String,
    /// Ops captured back to back in each graph (`--graph-ops`); the time is per op.
    #[serde(default = "one")]
    pub graph_ops: u32,
    /// Simulation only: bytes one rank's kernel reads plus writes in memory on the path taken
    /// (`stats::sim_rank_bytes`); empty elsewhere, and in older files.
    #[serde(default, serialize_with = "decimals0")]
    pub rank_bytes: Option<f64>,
}

fn one() -> u32 {
    1
}

/// Times with 3 decimals, fractions with 4, absent values as empty fields.
fn decimals<S: Serializer>(v: &Option<f64>, decimals: usize, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.map_or(String::new(), |x| format!("{x:.decimals$}")))
}
fn decimals3<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    decimals(v, 3, s)
}
fn decimals4<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    decimals(v, 4, s)
}
fn decimals0<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    decimals(v, 0, s)
}

impl Record {
    pub fn new(mode: &str, ranks: i32, dtype: &str, bytes: u64, strategy: &str, device: &str) -> Self {
        Record {
            mode: mode.into(),
            ranks,
            dtype: dtype.into(),
            bytes,
            strategy: strategy.into(),
            path: String::new(),
            status: Status::NotApplicable,
            median_us: None,
            p10_us: None,
            p90_us: None,
            eager_us: None,
            algbw_gbps: None,
            busbw_gbps: None,
            roof_frac: None,
            replays: 0,
            batches: 0,
            graph_ops: 1,
            rank_bytes: None,
            device: device.into(),
            note: String::new(),
            shape: String::new(),
        }
    }

    /// Fills the bandwidth columns from `median_us` (`roof_gbps`: the copy roofline, sim only).
    pub fn derive_bandwidths(&mut self, roof_gbps: Option<f64>) {
        if let Some(t) = self.median_us.filter(|t| *t > 0.0 && self.bytes > 0) {
            self.algbw_gbps = Some(crate::stats::algbw_gbps(self.bytes, t));
            self.busbw_gbps = Some(busbw_gbps(self.bytes, t, self.ranks));
            if let Some(roof) = roof_gbps.filter(|r| *r > 0.0) {
                self.rank_bytes = sim_rank_bytes(&self.path, self.bytes, self.ranks);
                self.roof_frac = self.rank_bytes.map(|b| self.ranks as f64 * b / (t * 1e-6) / 1e9 / roof);
            }
        }
    }

    /// Whether the row belongs to the fused sweep (its own table block and plot panel).
    pub fn is_fused(&self) -> bool {
        !self.shape.is_empty() || crate::case::is_fused_name(&self.strategy)
    }

    fn key(&self) -> (String, i32, String, bool) {
        (self.mode.clone(), self.ranks, self.dtype.clone(), self.is_fused())
    }
}

/// Reads a CSV the benchmark wrote (by column name: older files lack `shape` and `graph_ops`).
pub fn parse_csv(text: &str) -> anyhow::Result<Vec<Record>> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let headers = reader.headers()?.clone();
    // Every column but the three optional ones must be there, even in a file without rows.
    let columns = columns();
    if let Some(missing) = columns[..columns.len() - 3].iter().find(|c| !headers.iter().any(|h| h == c.as_str())) {
        anyhow::bail!("CSV has no column '{missing}'");
    }
    let mut out = Vec::new();
    for (line, row) in reader.deserialize::<Record>().enumerate() {
        let mut r = row.map_err(|e| anyhow::anyhow!("line {}: {e}", line + 2))?;
        r.graph_ops = r.graph_ops.max(1);
        out.push(r);
    }
    Ok(out)
}

/// The CSV's columns: the names CsvWriter writes in its header (Record's fields, renamed).
fn columns() -> Vec<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(Record::new("", 0, "", 0, "", "")).expect("a record serializes");
    let text = String::from_utf8(w.into_inner().expect("in memory")).expect("UTF-8");
    text.lines().next().unwrap_or("").split(',').map(str::to_owned).collect()
}

/// The CSV file, written one line per record as the run goes (a hang or crash leaves the rows
/// done so far).
pub struct CsvWriter {
    csv: csv::Writer<std::fs::File>,
}

impl CsvWriter {
    pub fn create(path: &std::path::Path) -> anyhow::Result<Self> {
        Ok(CsvWriter { csv: csv::Writer::from_path(path)? })
    }
    pub fn write(&mut self, r: &Record) -> anyhow::Result<()> {
        self.csv.serialize(r)?;
        Ok(self.csv.flush()?)
    }
}

/// Groups of records by (mode, ranks, dtype, plain or fused), in order of first appearance.
pub fn groups(records: &[Record]) -> Vec<Vec<&Record>> {
    let mut keys: Vec<(String, i32, String, bool)> = Vec::new();
    for r in records {
        if !keys.contains(&r.key()) {
            keys.push(r.key());
        }
    }
    keys.iter().map(|k| records.iter().filter(|r| &r.key() == k).collect()).collect()
}

/// Strategy rows of a group (not floor/copy), in order of first appearance.
pub fn strategies(group: &[&Record]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in group {
        if r.strategy != FLOOR && r.strategy != COPY && !names.contains(&r.strategy) {
            names.push(r.strategy.clone());
        }
    }
    names
}

pub fn is_meta(strategy: &str) -> bool {
    crate::case::Case::parse(strategy).is_some_and(|c| c.is_meta())
}

/// A row that may be "best": not AUTO or the plugin (meta), not an unfused baseline.
fn is_candidate(strategy: &str) -> bool {
    !crate::case::Case::parse(strategy).is_some_and(|c| c.is_meta() || c.is_baseline())
}

/// Whether the row's table cell shows the path it took.
fn shows_path(strategy: &str) -> bool {
    crate::case::Case::parse(strategy).is_some_and(|c| c.shows_path())
}

/// The fastest correct candidate row of a (group, size): among nccl/oneshot/twoshot/lamport
/// (plain), among fused_oneshot/fused_twoshot/fused_lamport (fused).
pub fn best<'a>(rows: &[&'a Record]) -> Option<&'a Record> {
    rows.iter()
        .filter(|r| r.status == Status::Ok && is_candidate(&r.strategy) && r.median_us.is_some())
        .min_by(|a, b| a.median_us.unwrap().total_cmp(&b.median_us.unwrap()))
        .copied()
}

fn fmt_us(t: f64) -> String {
    if t < 10.0 {
        format!("{t:.2}")
    } else if t < 1000.0 {
        format!("{t:.1}")
    } else {
        format!("{t:.0}")
    }
}

/// Tag of the path AUTO or the plugin took, appended to their cells.
fn path_tag(path: &str) -> &str {
    match path {
        "oneshot" => "1s",
        "twoshot" => "2s",
        "lamport" => "L",
        "nccl" => "N",
        other => other,
    }
}

fn cell(r: Option<&&Record>) -> String {
    let Some(r) = r else { return String::new() };
    match r.status {
        Status::Ok => {
            let t = r.median_us.map(fmt_us).unwrap_or_default();
            if shows_path(&r.strategy) && !r.path.is_empty() {
                format!("{t} {}", path_tag(&r.path))
            } else {
                t
            }
        }
        Status::Failed => "FAILED".into(),
        Status::NotApplicable => "-".into(),
        Status::Error => "error".into(),
    }
}

/// The text table: one block per (mode, ranks, dtype).
pub fn table(records: &[Record]) -> String {
    let mut out = String::new();
    let mut any_fused = false;
    for group in groups(records) {
        let first = group[0];
        // floor and copy are filed with the plain rows; a fused block shows them too.
        let same = |r: &&Record| r.mode == first.mode && r.ranks == first.ranks && r.dtype == first.dtype;
        let floor = records.iter().filter(same).find(|r| r.strategy == FLOOR).and_then(|r| r.median_us);
        let copy = records.iter().filter(same).find(|r| r.strategy == COPY).and_then(|r| r.algbw_gbps);
        let names = strategies(&group);
        if names.is_empty() {
            continue; // only floor and copy: the plain sweep did not run
        }
        if first.is_fused() {
            any_fused = true;
            fused_block(&mut out, &group, &names, floor);
            continue;
        }
        let sim = first.mode == "sim";
        let _ = write!(out, "\n{} · {} ranks · {}", first.mode, first.ranks, first.dtype);
        if !first.device.is_empty() {
            let _ = write!(out, " · {}", first.device);
        }
        if let Some(f) = floor {
            let _ = write!(out, " · floor {} µs", fmt_us(f));
        }
        if let Some(c) = copy {
            let _ = write!(out, " · copy roofline {c:.0} GB/s");
        }
        out.push('\n');
        let _ = write!(out, "{:>10}", "size");
        for n in &names {
            let _ = write!(out, " {n:>10}");
        }
        let _ = write!(out, " {:>9} {:>11}", "best", "busbw GB/s");
        if sim {
            let _ = write!(out, " {:>6}", "roof%");
        }
        let has_auto = names.iter().any(|n| n == "auto");
        if has_auto {
            let _ = write!(out, " {:>9}", "auto/best");
        }
        out.push('\n');
        let mut sizes: Vec<u64> =
            group.iter().filter(|r| r.strategy != FLOOR && r.strategy != COPY).map(|r| r.bytes).collect();
        sizes.sort_unstable();
        sizes.dedup();
        for bytes in sizes {
            let rows: Vec<&Record> =
                group.iter().filter(|r| r.bytes == bytes && names.contains(&r.strategy)).copied().collect();
            let _ = write!(out, "{:>10}", fmt_bytes(bytes));
            for n in &names {
                let _ = write!(out, " {:>10}", cell(rows.iter().find(|r| &r.strategy == n)));
            }
            match best(&rows) {
                Some(b) => {
                    let _ = write!(out, " {:>9} {:>11.1}", b.strategy, b.busbw_gbps.unwrap_or(0.0));
                    if sim {
                        let _ =
                            write!(out, " {:>6}", b.roof_frac.map_or(String::new(), |f| format!("{:.0}%", f * 100.0)));
                    }
                    if has_auto {
                        let auto = rows
                            .iter()
                            .find(|r| r.strategy == "auto" && r.status == Status::Ok)
                            .and_then(|r| r.median_us);
                        let ratio = auto.zip(b.median_us).map_or(String::new(), |(a, m)| format!("{:.2}", a / m));
                        let _ = write!(out, " {ratio:>9}");
                    }
                }
                None => {
                    let _ = write!(out, " {:>9} {:>11}", "-", "");
                }
            }
            out.push('\n');
        }
        if sim {
            traffic_block(&mut out, &group, &names);
        }
        let bad: Vec<&&Record> = group.iter().filter(|r| matches!(r.status, Status::Failed | Status::Error)).collect();
        for r in bad {
            let _ = writeln!(out, "  {} {} at {}: {}", r.strategy, r.status.name(), fmt_bytes(r.bytes), r.note);
        }
    }
    if records.iter().any(|r| !r.is_fused() && r.strategy != FLOOR && r.strategy != COPY) {
        out.push_str(LEGEND);
    }
    if any_fused {
        out.push_str(FUSED_LEGEND);
    }
    out
}

/// Simulation: per size and row, the memory traffic of one rank on the path taken and the
/// fraction of the copy roofline it reached (so the gap to the memory limit shows per row).
fn traffic_block(out: &mut String, group: &[&Record], names: &[String]) {
    let _ = writeln!(
        out,
        "{:>10} per rank: bytes read + written in memory on the path taken · roofline fraction",
        "traffic"
    );
    let mut sizes: Vec<u64> = group.iter().filter(|r| r.rank_bytes.is_some()).map(|r| r.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for bytes in sizes {
        let _ = write!(out, "{:>10}", fmt_bytes(bytes));
        for n in names {
            let r = group.iter().find(|r| r.bytes == bytes && &r.strategy == n && r.status == Status::Ok);
            let c = r
                .and_then(|r| r.rank_bytes.zip(r.roof_frac))
                .map_or(String::new(), |(b, f)| format!("{} {:.0}%", crate::stats::fmt_bytes_short(b), f * 100.0));
            let _ = write!(out, " {c:>10}");
        }
        out.push('\n');
    }
}

/// Sort key of a fused row: tokens, hidden, bias (from the shape), else bytes.
fn shape_key(r: &Record) -> (u64, u64, bool, String) {
    match crate::case::Shape::parse_label(&r.shape) {
        Some(s) => (s.tokens, s.hidden as u64, s.bias, r.shape.clone()),
        None => (u64::MAX, r.bytes, false, r.shape.clone()),
    }
}

/// One fused block: per shape, every row's µs, the best fused family, and the ratios of the
/// baselines (and AUTO) over it.
fn fused_block(out: &mut String, group: &[&Record], names: &[String], floor: Option<f64>) {
    let first = group[0];
    let _ = write!(
        out,
        "\n{} · {} ranks · {} · fused all-reduce + residual + RMSNorm",
        first.mode, first.ranks, first.dtype
    );
    if !first.device.is_empty() {
        let _ = write!(out, " · {}", first.device);
    }
    if let Some(f) = floor {
        let _ = write!(out, " · floor {} µs", fmt_us(f));
    }
    out.push('\n');
    let width = |n: &str| n.len().max(10);
    let _ = write!(out, "{:>14}", "shape");
    for n in names {
        let _ = write!(out, " {:>w$}", n, w = width(n));
    }
    let _ = write!(out, " {:>13}", "best fused");
    // (header, row whose time is divided by the best fused one's)
    let ratios: Vec<(&str, &str)> = [
        ("ar+norm/best", "ar_then_norm"),
        ("nccl+norm/best", "nccl_then_norm"),
        ("auto/best", "fused_auto"),
        ("plugin/best", "plugin_fused"),
    ]
    .into_iter()
    .filter(|(_, row)| names.iter().any(|n| n == row))
    .collect();
    for (h, _) in &ratios {
        let _ = write!(out, " {h:>w$}", w = h.len().max(9));
    }
    out.push('\n');
    let mut shapes: Vec<&Record> = Vec::new();
    for r in group {
        if !shapes.iter().any(|s| s.shape == r.shape && s.bytes == r.bytes) {
            shapes.push(r);
        }
    }
    shapes.sort_by_key(|r| shape_key(r));
    for s in shapes {
        let rows: Vec<&Record> = group.iter().filter(|r| r.shape == s.shape && r.bytes == s.bytes).copied().collect();
        let label = if s.shape.is_empty() { fmt_bytes(s.bytes) } else { s.shape.clone() };
        let _ = write!(out, "{label:>14}");
        for n in names {
            let _ = write!(out, " {:>w$}", cell(rows.iter().find(|r| &r.strategy == n)), w = width(n));
        }
        match best(&rows) {
            Some(b) => {
                let _ = write!(out, " {:>13}", b.strategy);
                for (h, row) in &ratios {
                    let t =
                        rows.iter().find(|r| &r.strategy == row && r.status == Status::Ok).and_then(|r| r.median_us);
                    let ratio = t.zip(b.median_us).map_or(String::new(), |(a, m)| format!("{:.2}", a / m));
                    let _ = write!(out, " {ratio:>w$}", w = h.len().max(9));
                }
            }
            None => {
                let _ = write!(out, " {:>13}", "-");
            }
        }
        out.push('\n');
    }
    for r in group.iter().filter(|r| matches!(r.status, Status::Failed | Status::Error)) {
        let _ = writeln!(
            out,
            "  {} {} at {}: {}",
            r.strategy,
            r.status.name(),
            if r.shape.is_empty() { fmt_bytes(r.bytes) } else { r.shape.clone() },
            r.note
        );
    }
}

const LEGEND: &str = "
µs per all-reduce, median of the graph-replay batches. auto/plugin: + the path taken (L lamport, 1s oneshot,
2s twoshot, N nccl). -: not applicable (the CSV's note says why). best: the fastest of nccl/oneshot/twoshot/lamport;
busbw = S/t·2(N-1)/N of the best; roof% (sim): the best row's memory traffic (N ranks × its bytes per rank) per
second over the copy roofline; auto/best: AUTO's time over the best's. traffic (sim): per row, the bytes one rank
reads + writes in memory on the path taken (nominal: every access once, no L2 reuse) and that roofline fraction.
p10/p90, eager times and bandwidths of every row are in the CSV.
";

const FUSED_LEGEND: &str = "
Fused blocks: µs per all-reduce + residual (+ bias) + RMSNorm of a tokens x hidden shape (+bias: with a bias input),
every kernel of the op in one call, median of the graph-replay batches. fused_*: one fused kernel of that family;
fused_auto / plugin_fused: + the path AUTO / the fused plugin took (N: NCCL then the norm kernel); ar_then_norm: + the
plain family AUTO picks for the size, then a separate residual + RMSNorm kernel; nccl_then_norm: ncclAllReduce then
that kernel. best fused: the fastest of fused_oneshot/twoshot/lamport; x/best: that row's time over the best fused one's
(> 1: fusing saves that factor).
";

#[cfg(test)]
mod tests {
    use super::*;

    /// What CsvWriter writes, in memory.
    fn to_csv(records: &[Record]) -> String {
        let mut w = csv::Writer::from_writer(Vec::new());
        records.iter().for_each(|r| w.serialize(r).unwrap());
        String::from_utf8(w.into_inner().unwrap()).unwrap()
    }

    fn rec(strategy: &str, bytes: u64, us: Option<f64>, status: Status) -> Record {
        let mut r = Record::new("sim", 4, "bf16", bytes, strategy, "NVIDIA H200");
        r.status = status;
        r.median_us = us;
        r.p10_us = us;
        r.p90_us = us;
        r.derive_bandwidths(Some(4000.0));
        r
    }

    #[test]
    fn csv_round_trips_with_quoting_and_empty_fields() {
        let mut a = rec("oneshot", 1 << 20, Some(12.5), Status::Ok);
        a.note = "said \"hi\", then\nleft".into();
        a.eager_us = Some(20.25);
        a.replays = 50;
        a.batches = 15;
        let b = rec("lamport", 64 << 20, None, Status::NotApplicable);
        let text = to_csv(&[a.clone(), b.clone()]);
        let back = parse_csv(&text).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].note, a.note);
        assert_eq!(back[0].median_us, Some(12.5));
        assert_eq!(back[0].eager_us, Some(20.25));
        assert_eq!(back[0].replays, 50);
        assert!((back[0].busbw_gbps.unwrap() - a.busbw_gbps.unwrap()).abs() < 1e-3);
        assert_eq!(back[1].status, Status::NotApplicable);
        assert_eq!(back[1].median_us, None);
        assert!(parse_csv("mode,ranks\n").is_err(), "missing columns are reported");
    }

    #[test]
    fn bandwidth_columns() {
        let mut r = rec("twoshot", 1_000_000, Some(1.0), Status::Ok);
        r.path = "twoshot".into();
        r.derive_bandwidths(Some(4000.0));
        assert!((r.algbw_gbps.unwrap() - 1000.0).abs() < 1e-9);
        assert!((r.busbw_gbps.unwrap() - 1500.0).abs() < 1e-9);
        assert_eq!(r.rank_bytes, Some(3.0e6), "4 ranks, the wide two-shot reading inputs in place: 3 S");
        assert!((r.roof_frac.unwrap() - 4.0 * 3.0e6 / 1e-6 / 1e9 / 4000.0).abs() < 1e-9);
    }

    #[test]
    fn table_picks_the_best_non_meta_row() {
        let mut auto = rec("auto", 1024, Some(3.0), Status::Ok);
        auto.path = "lamport".into();
        let mut floor = rec(FLOOR, 0, Some(2.0), Status::Ok);
        floor.derive_bandwidths(None);
        let records = vec![
            floor,
            rec("oneshot", 1024, Some(4.0), Status::Ok),
            rec("lamport", 1024, Some(3.5), Status::Ok),
            auto,
            rec("oneshot", 2048, Some(5.0), Status::Failed),
            rec("lamport", 2048, None, Status::NotApplicable),
        ];
        let refs: Vec<&Record> = records.iter().filter(|r| r.bytes == 1024).collect();
        assert_eq!(best(&refs).unwrap().strategy, "lamport", "auto is faster but is not a strategy of its own");
        let t = table(&records);
        assert!(t.contains("floor 2.00 µs"), "{t}");
        assert!(t.contains("3.00 L"), "{t}");
        assert!(t.contains("FAILED") && t.contains("auto/best") && t.contains("0.86"), "{t}");
        assert!(!t.contains("     0 B"), "floor is not a size: {t}");
    }

    fn fused(strategy: &str, shape: &str, us: Option<f64>, path: &str) -> Record {
        let s = crate::case::Shape::parse_label(shape).unwrap();
        let mut r = rec(
            strategy,
            s.tokens * s.hidden as u64 * 2,
            us,
            if us.is_some() { Status::Ok } else { Status::NotApplicable },
        );
        r.shape = shape.into();
        r.path = path.into();
        r
    }

    #[test]
    fn fused_rows_get_their_own_block_ratios_and_csv_shape() {
        let mut records = vec![rec("oneshot", 1024, Some(4.0), Status::Ok)];
        let mut floor = rec(FLOOR, 0, Some(2.0), Status::Ok);
        floor.derive_bandwidths(None);
        records.push(floor);
        for (shape, k) in [("8x4096", 1.0), ("1x8192+bias", 0.5)] {
            records.push(fused("fused_oneshot", shape, Some(10.0 * k), "oneshot"));
            records.push(fused("fused_twoshot", shape, Some(12.0 * k), "twoshot"));
            records.push(fused("fused_lamport", shape, None, ""));
            records.push(fused("fused_auto", shape, Some(10.5 * k), "oneshot"));
            records.push(fused("ar_then_norm", shape, Some(15.0 * k), "lamport"));
        }
        let g = groups(&records);
        assert_eq!(g.len(), 2, "plain and fused blocks");
        assert!(g[1].iter().all(|r| r.is_fused()) && !g[0].iter().any(|r| r.is_fused()));
        let t = table(&records);
        assert!(t.contains("fused all-reduce + residual + RMSNorm"), "{t}");
        assert!(t.contains("ar+norm/best") && t.contains("auto/best") && !t.contains("nccl+norm/best"), "{t}");
        let shapes_at: Vec<usize> = ["1x8192+bias", "8x4096"].iter().map(|s| t.find(s).unwrap()).collect();
        assert!(shapes_at[0] < shapes_at[1], "sorted by tokens: {t}");
        assert!(t.contains("1.50") && t.contains("1.05"), "ar_then_norm / best and auto / best: {t}");
        assert!(t.contains("15.0 L") && t.contains("10.5 1s"), "paths: {t}");
        assert!(t.matches("floor 2.00 µs").count() == 2, "the fused block shows the floor too: {t}");
        // The shape column round-trips, and a CSV without it still parses.
        let text = to_csv(&records);
        let key = |r: &Record| (r.strategy.clone(), r.shape.clone(), r.bytes, r.path.clone(), r.status, r.median_us);
        let back = parse_csv(&text).unwrap();
        assert_eq!(back.iter().map(key).collect::<Vec<_>>(), records.iter().map(key).collect::<Vec<_>>());
        assert!(back.iter().all(|r| r.graph_ops == 1));
        // An older CSV, without the shape, graph_ops and rank_bytes columns.
        let old: String = text.lines().map(|l| l.rsplitn(4, ',').last().unwrap().to_string() + "\n").collect();
        let back = parse_csv(&old).unwrap();
        assert_eq!((back.len(), key(&back[0])), (records.len(), key(&records[0])));
        assert!(back.iter().all(|r| r.shape.is_empty() && r.graph_ops == 1));
        // graph_ops round-trips.
        let mut twenty = records[0].clone();
        twenty.graph_ops = 20;
        let text = to_csv(&[twenty]);
        assert_eq!(parse_csv(&text).unwrap()[0].graph_ops, 20);
        // Only fused rows: no plain block, no plain legend.
        let only: Vec<Record> = records.iter().filter(|r| r.is_fused() || r.strategy == FLOOR).cloned().collect();
        let t = table(&only);
        assert!(!t.contains("busbw GB/s") && t.contains("best fused"), "{t}");
    }
}
