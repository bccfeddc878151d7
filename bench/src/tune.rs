//! `edgellm-allreduce-bench tune`: AUTO's tables measured on this machine, written as the
//! library's tuning file (`edgellm_allreduce::tuning`).
//!
//! It runs the benchmark's own sweeps (`crate::sweep`: the same timing, graphs and correctness
//! checks) over every way AUTO can take: each family's plain all-reduce and NCCL, and for the
//! fused all-reduce + residual + RMSNorm each fused family, each family's split path (plain
//! all-reduce, then the norm kernel) and NCCL then the norm kernel; for every rank count this
//! machine can form (real: one GPU per rank; sim: simulated ranks on one GPU, whose tables serve
//! same-device groups only) and every element type. Then, per (op, ranks, type, row width), the
//! fastest way at each measured size ([`winners`]), adjacent sizes with the same winner merged
//! into one row ([`merge`]), sections that came out identical for every type (or both row
//! widths) written once ([`sections`]), and the file with the machine's header.

use crate::case::{BiasMode, Case, Mode, Shape, Suite};
use crate::record::{Record, Status};
use crate::{gpu, stats, RunArgs, Swept};
use clap::Args;
use edgellm_allreduce::tuning::{library_id, Machine, RowWidth, Section, SectionKey, TunedOp, Tuning, FILE_NAME};
use edgellm_allreduce::{DataType, Family, FusedChoice, LinkClass, RANK_COUNTS};
use edgellm_test_support as data;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct TuneArgs {
    /// real: one GPU per rank, tables for this machine's links; sim: simulated ranks on one GPU,
    /// tables for same-device groups (tests, benchmarks).
    #[arg(long, value_enum, default_value_t = Mode::Real)]
    mode: Mode,
    /// Rank counts [real: each of 2, 4, 6, 8, 16 the GPUs can form; sim: 2,4,8].
    #[arg(long, value_delimiter = ',')]
    ranks: Vec<i32>,
    /// Element types (a type whose tables match the others' is written once, as dtype=any).
    #[arg(long, value_delimiter = ',', default_value = "bf16,fp16,fp32", value_parser = data::parse_dtype)]
    dtype: Vec<DataType>,
    /// Smallest plain message (powers of two from here).
    #[arg(long, default_value = "1K", value_parser = stats::parse_bytes)]
    min_bytes: u64,
    /// Largest plain message.
    #[arg(long, default_value = "64M", value_parser = stats::parse_bytes)]
    max_bytes: u64,
    /// Fused sweep: token counts [1,2,4,...,1024].
    #[arg(long, value_delimiter = ',')]
    tokens: Vec<u64>,
    /// Fused sweep: hidden sizes (up to 4096 tunes the narrow rows, wider the wide ones).
    #[arg(long, value_delimiter = ',', default_value = "4096,8192")]
    hidden: Vec<u32>,
    /// Skip the fused op (its calls keep the built-in tables).
    #[arg(long)]
    no_fused: bool,
    /// Largest message of the custom workspaces, as the library will run them [its default];
    /// give the same EDGELLM_ALLREDUCE_WORKSPACE_BYTES when it runs.
    #[arg(long, value_parser = stats::parse_bytes)]
    workspace_bytes: Option<u64>,
    /// Calls per timed batch [50; --quick: 10].
    #[arg(long)]
    replays: Option<u32>,
    /// Ops captured back to back in each graph (times per op), as a model's layers run them.
    #[arg(long, default_value_t = 20)]
    graph_ops: u32,
    /// Timed batches [15; --quick: 5].
    #[arg(long)]
    batches: Option<u32>,
    /// Untimed batches first [3; --quick: 1].
    #[arg(long)]
    warmup: Option<u32>,
    /// Ways within this many percent of the fastest are tied: the previous size's winner stays,
    /// else NCCL, else the fastest (fewer rows, and a custom kernel only where it is measurably
    /// faster).
    #[arg(long, default_value_t = 3.0)]
    tie_percent: f64,
    /// The tuning file to write [EDGELLM_ALLREDUCE_TUNING if set, else ./edgellm-allreduce-tuning.txt:
    /// copy it beside libNvInfer_edgellm_plugin.so, where the library looks for it].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Every measurement, as the benchmark's CSV.
    #[arg(long, default_value = "tune.csv")]
    csv: PathBuf,
    /// NCCL library for real mode [libnccl.so.2 from the loader's path].
    #[arg(long)]
    nccl_lib: Option<String>,
    /// The GPU of simulation mode.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Seconds without progress after which the run is declared hung (exit 3).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Smoke run: sizes x16 apart, 3 token counts, fewer replays and batches.
    #[arg(long)]
    quick: bool,
}

/// The ways `tune` measures, plain then fused (NCCL only in real mode).
fn cases(mode: Mode, fused: bool) -> Vec<Case> {
    let mut out = Vec::new();
    if mode == Mode::Real {
        out.push(Case::Nccl);
    }
    out.extend(Family::ALL.map(Case::Custom));
    if fused {
        out.extend(Family::ALL.map(Case::Fused));
        out.extend(Family::ALL.map(Case::Split));
        if mode == Mode::Real {
            out.push(Case::NcclThenNorm);
        }
    }
    out
}

pub fn run(t: TuneArgs) -> i32 {
    let gpus = gpu::device_count();
    let ranks = match (t.mode, t.ranks.is_empty()) {
        (_, false) => t.ranks.clone(),
        (Mode::Sim, true) => vec![2, 4, 8],
        (Mode::Real, true) => RANK_COUNTS.into_iter().filter(|&n| n <= gpus).collect(),
    };
    if ranks.is_empty() {
        eprintln!(
            "error: real mode needs 2 or more GPUs; this machine has {gpus} (tune --mode sim tunes simulated ranks)"
        );
        return 2;
    }
    let tokens = match (t.tokens.is_empty(), t.quick) {
        (false, _) => t.tokens.clone(),
        (true, false) => (0..=10).map(|p| 1u64 << p).collect(),
        (true, true) => vec![1, 16, 256],
    };
    let shapes: Vec<(u64, u32)> = tokens.iter().flat_map(|&k| t.hidden.iter().map(move |&h| (k, h))).collect();
    let args = RunArgs {
        mode: t.mode,
        ranks: ranks.clone(),
        dtype: t.dtype.clone(),
        min_bytes: t.min_bytes,
        max_bytes: t.max_bytes,
        sizes: Vec::new(),
        strategies: cases(t.mode, !t.no_fused),
        suite: Some(if t.no_fused { Suite::Plain } else { Suite::All }),
        fused: false,
        shapes,
        bias: BiasMode::Off,
        workspace_bytes: t.workspace_bytes,
        replays: t.replays,
        graph_ops: t.graph_ops,
        batches: t.batches,
        warmup: t.warmup,
        no_eager: true,
        profiler: false,
        quick: t.quick,
        csv: t.csv.clone(),
        plot: PathBuf::new(),
        no_plot: true,
        font: None,
        nccl_lib: t.nccl_lib.clone(),
        device: t.device,
        timeout: t.timeout,
    };
    let Swept { records, outcome } = match crate::sweep(&args) {
        Ok(swept) => swept,
        Err(code) => return code,
    };
    print!("{}", crate::record::table(&records));
    if let Err(e) = outcome {
        eprintln!("error: the run stopped: {}; no tuning file written (measurements so far: {})", e.0, t.csv.display());
        return 2;
    }
    let failed = records.iter().filter(|r| r.status == Status::Failed).count();
    if failed > 0 {
        eprintln!("warning: {failed} row(s) FAILED their correctness check: those ways are left out of the tables");
    }
    // After the sweep: the driver is initialised by now, after the environment was set for it.
    let (links, kept) = match links_of(t.mode, t.device, &ranks) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let machine = match Machine::current() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: describing this machine: {e}");
            return 2;
        }
    };
    let measured: Vec<Measurement> = measurements(&records).into_iter().filter(|m| kept.contains(&m.nranks)).collect();
    let tuning = Tuning {
        machine,
        links,
        library: library_id(),
        grids: Vec::new(),
        sections: sections(&measured, t.tie_percent / 100.0),
    };
    if let Err(e) = tuning.validate() {
        eprintln!("error: the measurements give no valid tables ({e}); nothing written");
        return 2;
    }
    let out = t.out.clone().unwrap_or_else(default_out);
    let note = format!(
        "# edgellm-allreduce-bench tune --mode {}: graph replay, {} ops per graph, median over batches; ties within {}%\n",
        t.mode.name(),
        t.graph_ops,
        t.tie_percent
    );
    let text = note + &tuning.to_text();
    if let Err(e) = write_atomically(&out, &text) {
        eprintln!("error: writing {}: {e}", out.display());
        return 2;
    }
    println!("\n{text}");
    println!(
        "tuning file: {} (fingerprint {:016x}); the library reads it from EDGELLM_ALLREDUCE_TUNING, else as {FILE_NAME} beside itself",
        out.display(),
        tuning.fingerprint()
    );
    0
}

/// `EDGELLM_ALLREDUCE_TUNING` (the file the library will read), else [`FILE_NAME`] here.
fn default_out() -> PathBuf {
    std::env::var_os("EDGELLM_ALLREDUCE_TUNING")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(FILE_NAME), PathBuf::from)
}

/// Written beside `path` then renamed over it: a reader never sees half a file.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The links the tables are for, and the rank counts measured on them: sim, one device; real,
/// the class of the largest group (GPUs 0..n), with the rank counts whose group has the same
/// class (the others, said, keep the built-in tables).
fn links_of(mode: Mode, device: i32, ranks: &[i32]) -> Result<(LinkClass, Vec<i32>), String> {
    if mode == Mode::Sim {
        let facts = edgellm_allreduce::pair_facts(&[device, device], edgellm_allreduce::link_facts);
        println!("{}", edgellm_allreduce::describe_links(&facts));
        return Ok((LinkClass::SameDevice, ranks.to_vec()));
    }
    let class_of = |n: i32| {
        let devices: Vec<i32> = (0..n).collect();
        let facts = edgellm_allreduce::pair_facts(&devices, edgellm_allreduce::link_facts);
        println!("{n} ranks on GPUs {devices:?}: {}", edgellm_allreduce::describe_links(&facts));
        edgellm_allreduce::group_class(&facts)
    };
    let classes: Vec<(i32, LinkClass)> = ranks.iter().map(|&n| (n, class_of(n))).collect();
    let Some(&(largest, links)) = classes.iter().max_by_key(|(n, _)| *n) else {
        return Err("no rank count to tune".into());
    };
    if links == LinkClass::NoPeer {
        return Err(format!(
            "the {largest} GPUs have no peer access between them: the custom kernels cannot run (NCCL always); nothing to tune"
        ));
    }
    let mut kept = Vec::new();
    for (n, class) in classes {
        if class == links {
            kept.push(n);
        } else {
            eprintln!("warning: {n} ranks are joined by {} links, not {} as {largest} ranks are: the file has no rows for {n} ranks (built-in tables)", class.name(), links.name());
        }
    }
    Ok((links, kept))
}

/// One timing: a way at one size of one (op, ranks, type, row width).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    pub op: TunedOp,
    pub nranks: i32,
    pub dtype: DataType,
    /// The fused op's row width ([`RowWidth::Narrow`] or [`RowWidth::Wide`]); None plain.
    pub width: Option<RowWidth>,
    pub bytes: u64,
    pub way: FusedChoice,
    /// Per-op time (µs), the median of the graph replays.
    pub us: f64,
}

/// The way a benchmark row measured, and for which op; None for rows that are not a way
/// (AUTO, the plugin, the floor, `ar_then_norm`).
fn way_of(strategy: &str) -> Option<(TunedOp, FusedChoice)> {
    match Case::parse(strategy)? {
        Case::Nccl => Some((TunedOp::Plain, FusedChoice::Nccl)),
        Case::Custom(f) => Some((TunedOp::Plain, FusedChoice::Fused(f))),
        Case::Fused(f) => Some((TunedOp::Fused, FusedChoice::Fused(f))),
        Case::Split(f) => Some((TunedOp::Fused, FusedChoice::Split(f))),
        Case::NcclThenNorm => Some((TunedOp::Fused, FusedChoice::Nccl)),
        _ => None,
    }
}

/// The timings of the rows that ran and passed their checks.
pub fn measurements(records: &[Record]) -> Vec<Measurement> {
    records
        .iter()
        .filter(|r| r.status == Status::Ok)
        .filter_map(|r| {
            let (op, way) = way_of(&r.strategy)?;
            let width = match op {
                TunedOp::Plain => None,
                TunedOp::Fused => Some(RowWidth::of(Shape::parse_label(&r.shape)?.hidden)),
            };
            Some(Measurement {
                op,
                nranks: r.ranks,
                dtype: data::parse_dtype(&r.dtype).ok()?,
                width,
                bytes: r.bytes,
                way,
                us: r.median_us.filter(|t| t.is_finite() && *t > 0.0)?,
            })
        })
        .collect()
}

/// A fixed order of the ways, for exact ties.
fn order(way: FusedChoice) -> usize {
    match way {
        FusedChoice::Nccl => 0,
        FusedChoice::Fused(f) => 1 + f as usize,
        FusedChoice::Split(f) => 4 + f as usize,
    }
}

/// The way AUTO should take at each measured size of one table: `(bytes, way, µs)` points
/// (several of one way at one size are averaged), sizes ascending. Ways within `tie` (a
/// fraction) of the fastest are tied: the previous size's winner stays, else NCCL, else the
/// fastest (exact ties in a fixed order).
pub fn winners(points: &[(u64, FusedChoice, f64)], tie: f64) -> Vec<(u64, FusedChoice)> {
    let mut by_size: BTreeMap<u64, Vec<(FusedChoice, f64, u32)>> = BTreeMap::new();
    for &(bytes, way, us) in points {
        let at = by_size.entry(bytes).or_default();
        match at.iter_mut().find(|(w, _, _)| *w == way) {
            Some((_, sum, n)) => {
                *sum += us;
                *n += 1;
            }
            None => at.push((way, us, 1)),
        }
    }
    let mut out: Vec<(u64, FusedChoice)> = Vec::new();
    for (bytes, ways) in by_size {
        let mut ways: Vec<(FusedChoice, f64)> = ways.into_iter().map(|(w, sum, n)| (w, sum / n as f64)).collect();
        ways.sort_by(|a, b| a.1.total_cmp(&b.1).then(order(a.0).cmp(&order(b.0))));
        let Some(&(fastest, best)) = ways.first() else {
            continue;
        };
        let tied = |w: FusedChoice| ways.iter().any(|&(x, us)| x == w && us <= best * (1.0 + tie.max(0.0)));
        let previous = out.last().map(|&(_, w)| w).filter(|&w| tied(w));
        let nccl = Some(FusedChoice::Nccl).filter(|&w| tied(w));
        out.push((bytes, previous.or(nccl).unwrap_or(fastest)));
    }
    out
}

/// A table's rows from its winners: each run of sizes with one winner becomes a row up to the
/// run's largest size; the last row is unbounded.
pub fn merge(winners: &[(u64, FusedChoice)]) -> Vec<(u64, FusedChoice)> {
    let mut rows: Vec<(u64, FusedChoice)> = Vec::new();
    for &(bytes, way) in winners {
        match rows.last_mut() {
            Some((bound, w)) if *w == way => *bound = bytes,
            _ => rows.push((bytes, way)),
        }
    }
    if let Some(last) = rows.last_mut() {
        last.0 = u64::MAX;
    }
    rows
}

fn dtype_index(d: DataType) -> usize {
    match d {
        DataType::Float => 0,
        DataType::Half => 1,
        DataType::Bf16 => 2,
    }
}
const DTYPES: [DataType; 3] = [DataType::Float, DataType::Half, DataType::Bf16];

/// The tuning file's sections from every measurement: one table per (op, ranks, type, row
/// width), the two widths of a type written once (`rows=any`) when their tables agree, and
/// every type written once (`dtype=any`) when all three were measured and agree.
pub fn sections(measured: &[Measurement], tie: f64) -> Vec<Section> {
    type Tables = BTreeMap<Option<RowWidth>, Vec<(u64, FusedChoice)>>;
    type Key = (TunedOp, i32, usize, Option<RowWidth>);
    let mut points: BTreeMap<Key, Vec<(u64, FusedChoice, f64)>> = BTreeMap::new();
    for m in measured {
        points.entry((m.op, m.nranks, dtype_index(m.dtype), m.width)).or_default().push((m.bytes, m.way, m.us));
    }
    // (op, ranks) -> type -> width -> rows.
    let mut tables: BTreeMap<(TunedOp, i32), BTreeMap<usize, Tables>> = BTreeMap::new();
    for ((op, n, d, w), p) in points {
        let rows = merge(&winners(&p, tie));
        if !rows.is_empty() {
            tables.entry((op, n)).or_default().entry(d).or_default().insert(w, rows);
        }
    }
    let mut out = Vec::new();
    for ((op, nranks), mut by_type) in tables {
        for widths in by_type.values_mut() {
            let (narrow, wide) = (Some(RowWidth::Narrow), Some(RowWidth::Wide));
            if widths.len() == 2 && widths.get(&narrow) == widths.get(&wide) {
                let rows = widths.remove(&narrow).unwrap_or_default();
                widths.clear();
                widths.insert(Some(RowWidth::Any), rows);
            }
        }
        let first = by_type.values().next().cloned();
        let uniform = by_type.len() == DTYPES.len() && by_type.values().all(|t| Some(t) == first.as_ref());
        let typed: Vec<(Option<DataType>, Tables)> = if uniform {
            vec![(None, first.unwrap_or_default())]
        } else {
            by_type.into_iter().map(|(d, t)| (Some(DTYPES[d]), t)).collect()
        };
        for (dtype, widths) in typed {
            for (width, rows) in widths {
                out.push(Section { key: SectionKey { op, nranks, dtype, width }, rows });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use FusedChoice::*;

    const L: FusedChoice = Fused(Family::Lamport);
    const O: FusedChoice = Fused(Family::OneShot);
    const T: FusedChoice = Fused(Family::TwoShot);

    #[test]
    fn the_fastest_wins_and_runs_merge_into_rows() {
        let p = [
            (1024, L, 5.0),
            (1024, O, 7.0),
            (1024, Nccl, 20.0),
            (4096, L, 6.0),
            (4096, O, 7.5),
            (4096, Nccl, 21.0),
            (65536, L, 12.0),
            (65536, O, 9.0),
            (65536, Nccl, 22.0),
            (1 << 20, O, 40.0),
            (1 << 20, T, 30.0),
            (1 << 20, Nccl, 45.0),
            (16 << 20, T, 300.0),
            (16 << 20, Nccl, 250.0),
        ];
        let w = winners(&p, 0.0);
        assert_eq!(w, [(1024, L), (4096, L), (65536, O), (1 << 20, T), (16 << 20, Nccl)]);
        assert_eq!(merge(&w), [(4096, L), (65536, O), (1 << 20, T), (u64::MAX, Nccl)]);
        // Given in any order, the same.
        let mut shuffled = p.to_vec();
        shuffled.reverse();
        assert_eq!(winners(&shuffled, 0.0), w);
    }

    #[test]
    fn ties_keep_the_previous_winner_then_nccl() {
        // Within 3%: Lamport stays at 4 KiB (previous winner) although the one-shot is faster.
        let p = [(1024, L, 5.0), (1024, O, 6.0), (4096, L, 6.1), (4096, O, 6.0)];
        assert_eq!(winners(&p, 0.03), [(1024, L), (4096, L)]);
        assert_eq!(winners(&p, 0.0), [(1024, L), (4096, O)], "no tolerance: the fastest");
        // A custom kernel only where it beats NCCL by more than the tolerance.
        let p = [(1 << 20, O, 40.0), (1 << 20, Nccl, 41.0)];
        assert_eq!(winners(&p, 0.03), [(1 << 20, Nccl)]);
        // Exact ties in a fixed order: NCCL, then fused, then split, Lamport... by family.
        let p = [(1024, T, 5.0), (1024, O, 5.0)];
        assert_eq!(winners(&p, 0.0), [(1024, O)]);
        let p = [(1024, Split(Family::OneShot), 5.0), (1024, O, 5.0)];
        assert_eq!(winners(&p, 0.0), [(1024, O)]);
        // Repeated timings of one way at one size are averaged.
        let p = [(1024, L, 4.0), (1024, L, 8.0), (1024, O, 5.0)];
        assert_eq!(winners(&p, 0.0), [(1024, O)]);
    }

    #[test]
    fn rows_are_monotone_and_end_unbounded() {
        // Alternating winners: one row per size, strictly increasing, the last unbounded.
        let w: Vec<(u64, FusedChoice)> = (10..20).map(|p| (1u64 << p, if p % 2 == 0 { L } else { O })).collect();
        let rows = merge(&w);
        assert_eq!(rows.len(), 10);
        assert!(rows.windows(2).all(|r| r[0].0 < r[1].0));
        assert_eq!(rows.last(), Some(&(u64::MAX, O)));
        assert_eq!(merge(&[(1024, Nccl)]), [(u64::MAX, Nccl)]);
        assert!(merge(&[]).is_empty());
        // Sizes where nothing ran leave no point.
        assert!(winners(&[], 0.03).is_empty());
    }

    fn m(
        op: TunedOp,
        nranks: i32,
        dtype: DataType,
        width: Option<RowWidth>,
        bytes: u64,
        way: FusedChoice,
        us: f64,
    ) -> Measurement {
        Measurement { op, nranks, dtype, width, bytes, way, us }
    }

    #[test]
    fn identical_types_and_widths_are_written_once() {
        let mut ms = Vec::new();
        for d in DTYPES {
            ms.push(m(TunedOp::Plain, 2, d, None, 1024, L, 5.0));
            ms.push(m(TunedOp::Plain, 2, d, None, 1 << 20, Nccl, 40.0));
            ms.push(m(TunedOp::Plain, 2, d, None, 1 << 20, O, 50.0));
        }
        // fp32 differs at 4 ranks; only bf16 was measured for the fused op.
        for d in DTYPES {
            let way = if d == DataType::Float { O } else { L };
            ms.push(m(TunedOp::Plain, 4, d, None, 1024, way, 5.0));
        }
        for w in [RowWidth::Narrow, RowWidth::Wide] {
            ms.push(m(TunedOp::Fused, 2, DataType::Bf16, Some(w), 8192, L, 5.0));
            ms.push(m(TunedOp::Fused, 2, DataType::Bf16, Some(w), 1 << 20, Split(Family::OneShot), 30.0));
        }
        ms.push(m(TunedOp::Fused, 4, DataType::Bf16, Some(RowWidth::Wide), 8192, L, 5.0));
        ms.push(m(TunedOp::Fused, 4, DataType::Bf16, Some(RowWidth::Narrow), 8192, O, 5.0));
        let s = sections(&ms, 0.03);
        let keys: Vec<String> = s.iter().map(|s| s.key.to_string()).collect();
        assert_eq!(
            keys,
            [
                "plain ranks=2 dtype=any",
                "plain ranks=4 dtype=fp32",
                "plain ranks=4 dtype=fp16",
                "plain ranks=4 dtype=bf16",
                "fused ranks=2 dtype=bf16 rows=any",
                "fused ranks=4 dtype=bf16 rows=narrow",
                "fused ranks=4 dtype=bf16 rows=wide",
            ]
        );
        assert_eq!(s[0].rows, [(1024, L), (u64::MAX, Nccl)]);
        assert_eq!(s[4].rows, [(8192, L), (u64::MAX, Split(Family::OneShot))]);
        // The result is a valid tuning file, and reads back the same.
        let t = Tuning {
            machine: Machine {
                host: "h".into(),
                driver: "d".into(),
                gpus: vec![edgellm_allreduce::tuning::Gpu { bus_id: "0000:01:00.0".into(), name: "G".into() }],
            },
            links: LinkClass::Pcie,
            library: library_id(),
            grids: Vec::new(),
            sections: s,
        };
        t.validate().unwrap();
        assert_eq!(Tuning::parse(&t.to_text()).unwrap(), t);
    }

    #[test]
    fn benchmark_rows_become_measurements() {
        let rec = |strategy: &str, status: Status, us: Option<f64>, shape: &str, bytes: u64| {
            let mut r = Record::new("real", 2, "bf16", bytes, strategy, "GPU");
            (r.status, r.median_us, r.shape) = (status, us, shape.to_owned());
            r
        };
        let records = [
            rec("nccl", Status::Ok, Some(20.0), "", 1024),
            rec("lamport", Status::Ok, Some(5.0), "", 1024),
            rec("twoshot", Status::Failed, Some(1.0), "", 1024),
            rec("oneshot", Status::NotApplicable, None, "", 1 << 30),
            rec("auto", Status::Ok, Some(5.0), "", 1024),
            rec("floor", Status::Ok, Some(1.0), "", 0),
            rec("fused_lamport", Status::Ok, Some(6.0), "1x8192", 16384),
            rec("split_oneshot", Status::Ok, Some(7.0), "1x4096+bias", 8192),
            rec("nccl_then_norm", Status::Ok, Some(25.0), "1x4096", 8192),
            rec("ar_then_norm", Status::Ok, Some(7.0), "1x4096", 8192),
            rec("lamport", Status::Ok, Some(f64::NAN), "", 2048),
        ];
        let ms = measurements(&records);
        let got: Vec<(TunedOp, Option<RowWidth>, FusedChoice)> = ms.iter().map(|m| (m.op, m.width, m.way)).collect();
        assert_eq!(
            got,
            [
                (TunedOp::Plain, None, Nccl),
                (TunedOp::Plain, None, L),
                (TunedOp::Fused, Some(RowWidth::Wide), L),
                (TunedOp::Fused, Some(RowWidth::Narrow), Split(Family::OneShot)),
                (TunedOp::Fused, Some(RowWidth::Narrow), Nccl),
            ],
            "failed, n/a, AUTO's, the floor, ar_then_norm and unusable times are left out"
        );
        assert!(ms.iter().all(|m| m.nranks == 2 && m.dtype == DataType::Bf16));
    }

    #[test]
    fn the_ways_measured() {
        let names = |c: Vec<Case>| c.iter().map(|c| c.name()).collect::<Vec<_>>().join(",");
        let families = |prefix: &str| Family::ALL.map(|f| format!("{prefix}{}", f.name())).join(",");
        assert_eq!(
            names(cases(Mode::Real, true)),
            format!("nccl,{},{},{},nccl_then_norm", families(""), families("fused_"), families("split_"))
        );
        assert_eq!(names(cases(Mode::Sim, false)), families(""));
        for c in cases(Mode::Real, true) {
            assert!(way_of(c.name()).is_some(), "{}", c.name());
        }
    }
}
