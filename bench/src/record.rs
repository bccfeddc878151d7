//! Results: one [`Record`] per (mode, ranks, dtype, bytes, strategy); the CSV file (written as
//! the run goes, read back by the `plot` and `table` subcommands) and the text table.

use crate::stats::{busbw_gbps, fmt_bytes, simbw_gbps};
use std::fmt::Write as _;
use std::io::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Timed, and every correctness check passed.
    Ok,
    /// A correctness check failed (the note says which and how).
    Failed,
    /// The row cannot run at this size (not served, no NCCL, ...); the note says why.
    NotApplicable,
    /// A CUDA / NCCL / library error; the note holds it.
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
    fn parse(s: &str) -> Option<Status> {
        [Status::Ok, Status::Failed, Status::NotApplicable, Status::Error].into_iter().find(|x| x.name() == s)
    }
}

/// Strategy names of the two extra rows of a simulation group.
pub const FLOOR: &str = "floor";
pub const COPY: &str = "copy";

#[derive(Clone, Debug, PartialEq)]
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
    pub median_us: Option<f64>,
    pub p10_us: Option<f64>,
    pub p90_us: Option<f64>,
    /// Per-call time of eager launches (µs), median over the batches.
    pub eager_us: Option<f64>,
    pub algbw_gbps: Option<f64>,
    pub busbw_gbps: Option<f64>,
    /// Simulation only: (N+1)·S/t over the copy roofline of the run.
    pub roof_frac: Option<f64>,
    pub replays: u32,
    pub batches: u32,
    pub device: String,
    pub note: String,
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
            device: device.into(),
            note: String::new(),
        }
    }

    /// Fills the bandwidth columns from `median_us` (`roof_gbps`: the copy roofline, sim only).
    pub fn derive_bandwidths(&mut self, roof_gbps: Option<f64>) {
        if let Some(t) = self.median_us.filter(|t| *t > 0.0 && self.bytes > 0) {
            self.algbw_gbps = Some(crate::stats::algbw_gbps(self.bytes, t));
            self.busbw_gbps = Some(busbw_gbps(self.bytes, t, self.ranks));
            if let Some(roof) = roof_gbps.filter(|r| *r > 0.0) {
                self.roof_frac = Some(simbw_gbps(self.bytes, t, self.ranks) / roof);
            }
        }
    }

    fn key(&self) -> (String, i32, String) {
        (self.mode.clone(), self.ranks, self.dtype.clone())
    }
}

pub const HEADER: [&str; 18] = [
    "mode", "ranks", "dtype", "bytes", "strategy", "path", "status", "median_us", "p10_us", "p90_us", "eager_us",
    "algbw_GBps", "busbw_GBps", "roof_frac", "replays", "batches", "device", "note",
];

fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or(String::new(), |x| format!("{x:.decimals$}"))
}

pub fn csv_line(r: &Record) -> String {
    let fields = [
        r.mode.clone(),
        r.ranks.to_string(),
        r.dtype.clone(),
        r.bytes.to_string(),
        r.strategy.clone(),
        r.path.clone(),
        r.status.name().to_string(),
        num(r.median_us, 3),
        num(r.p10_us, 3),
        num(r.p90_us, 3),
        num(r.eager_us, 3),
        num(r.algbw_gbps, 3),
        num(r.busbw_gbps, 3),
        num(r.roof_frac, 4),
        r.replays.to_string(),
        r.batches.to_string(),
        r.device.clone(),
        r.note.clone(),
    ];
    fields.iter().map(|f| quote(f)).collect::<Vec<_>>().join(",")
}

/// Splits CSV text into records of fields (RFC 4180 quoting).
fn split_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let (mut row, mut field, mut quoted, mut chars) = (Vec::new(), String::new(), false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows.retain(|r| !(r.len() == 1 && r[0].is_empty()));
    rows
}

pub fn parse_csv(text: &str) -> Result<Vec<Record>, String> {
    let mut rows = split_csv(text).into_iter();
    let header = rows.next().ok_or("empty CSV")?;
    let col = |name: &str| header.iter().position(|h| h == name).ok_or(format!("CSV has no column '{name}'"));
    let idx: Vec<usize> = HEADER.iter().map(|h| col(h)).collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for (line, row) in rows.enumerate() {
        let get = |i: usize| row.get(idx[i]).map(String::as_str).unwrap_or("");
        let opt = |i: usize| -> Result<Option<f64>, String> {
            let s = get(i);
            if s.is_empty() {
                Ok(None)
            } else {
                s.parse().map(Some).map_err(|_| format!("line {}: '{s}' is not a number ({})", line + 2, HEADER[i]))
            }
        };
        let int = |i: usize| get(i).parse::<u64>().map_err(|_| format!("line {}: '{}' is not an integer ({})", line + 2, get(i), HEADER[i]));
        out.push(Record {
            mode: get(0).into(),
            ranks: int(1)? as i32,
            dtype: get(2).into(),
            bytes: int(3)?,
            strategy: get(4).into(),
            path: get(5).into(),
            status: Status::parse(get(6)).ok_or(format!("line {}: unknown status '{}'", line + 2, get(6)))?,
            median_us: opt(7)?,
            p10_us: opt(8)?,
            p90_us: opt(9)?,
            eager_us: opt(10)?,
            algbw_gbps: opt(11)?,
            busbw_gbps: opt(12)?,
            roof_frac: opt(13)?,
            replays: int(14).unwrap_or(0) as u32,
            batches: int(15).unwrap_or(0) as u32,
            device: get(16).into(),
            note: get(17).into(),
        });
    }
    Ok(out)
}

/// The CSV file, written one line per record as the run goes (a hang or crash leaves the rows
/// done so far).
pub struct CsvWriter {
    file: std::io::BufWriter<std::fs::File>,
}

impl CsvWriter {
    pub fn create(path: &std::path::Path) -> std::io::Result<Self> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        writeln!(file, "{}", HEADER.join(","))?;
        file.flush()?;
        Ok(CsvWriter { file })
    }
    pub fn write(&mut self, r: &Record) -> std::io::Result<()> {
        writeln!(self.file, "{}", csv_line(r))?;
        self.file.flush()
    }
}

/// Groups of records by (mode, ranks, dtype), in order of first appearance.
pub fn groups(records: &[Record]) -> Vec<Vec<&Record>> {
    let mut keys: Vec<(String, i32, String)> = Vec::new();
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

/// The fastest correct non-meta row of a (group, size).
pub fn best<'a>(rows: &[&'a Record]) -> Option<&'a Record> {
    rows.iter()
        .filter(|r| r.status == Status::Ok && !is_meta(&r.strategy) && r.median_us.is_some())
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
            if is_meta(&r.strategy) && !r.path.is_empty() {
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
    for group in groups(records) {
        let first = group[0];
        let floor = group.iter().find(|r| r.strategy == FLOOR).and_then(|r| r.median_us);
        let copy = group.iter().find(|r| r.strategy == COPY).and_then(|r| r.algbw_gbps);
        let names = strategies(&group);
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
        let mut sizes: Vec<u64> = group.iter().filter(|r| r.strategy != FLOOR && r.strategy != COPY).map(|r| r.bytes).collect();
        sizes.sort_unstable();
        sizes.dedup();
        for bytes in sizes {
            let rows: Vec<&Record> = group.iter().filter(|r| r.bytes == bytes && names.contains(&r.strategy)).copied().collect();
            let _ = write!(out, "{:>10}", fmt_bytes(bytes));
            for n in &names {
                let _ = write!(out, " {:>10}", cell(rows.iter().find(|r| &r.strategy == n)));
            }
            match best(&rows) {
                Some(b) => {
                    let _ = write!(out, " {:>9} {:>11.1}", b.strategy, b.busbw_gbps.unwrap_or(0.0));
                    if sim {
                        let _ = write!(out, " {:>6}", b.roof_frac.map_or(String::new(), |f| format!("{:.0}%", f * 100.0)));
                    }
                    if has_auto {
                        let auto = rows.iter().find(|r| r.strategy == "auto" && r.status == Status::Ok).and_then(|r| r.median_us);
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
        let bad: Vec<&&Record> = group.iter().filter(|r| matches!(r.status, Status::Failed | Status::Error)).collect();
        for r in bad {
            let _ = writeln!(out, "  {} {} at {}: {}", r.strategy, r.status.name(), fmt_bytes(r.bytes), r.note);
        }
    }
    if !records.is_empty() {
        out.push_str(LEGEND);
    }
    out
}

const LEGEND: &str = "
µs per all-reduce, median of the graph-replay batches. auto/plugin: + the path taken (L lamport, 1s oneshot,
2s twoshot, N nccl). -: not applicable (the CSV's note says why). best: the fastest of nccl/oneshot/twoshot/lamport;
busbw = S/t·2(N-1)/N of the best; roof% (sim): (N+1)·S/t of the best over the copy roofline; auto/best: AUTO's time
over the best's. p10/p90, eager times and bandwidths of every row are in the CSV.
";

#[cfg(test)]
mod tests {
    use super::*;

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
        let text = format!("{}\n{}\n{}\n", HEADER.join(","), csv_line(&a), csv_line(&b));
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
        let r = rec("twoshot", 1_000_000, Some(1.0), Status::Ok);
        assert!((r.algbw_gbps.unwrap() - 1000.0).abs() < 1e-9);
        assert!((r.busbw_gbps.unwrap() - 1500.0).abs() < 1e-9);
        assert!((r.roof_frac.unwrap() - 5000.0 / 4000.0).abs() < 1e-9);
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
}
