//! `edgellm-allreduce-bench tune`: AUTO's tables measured on this machine, written as the
//! library's tuning file (`edgellm_allreduce::tuning`).
//!
//! It runs the benchmark's own sweeps (`crate::sweep`: the same timing, graphs and correctness
//! checks) twice, for every rank count this machine can form (real: one GPU per rank; sim:
//! simulated ranks on one GPU, whose tables serve same-device groups only):
//! 1. the grid sweep ([`grid`]): each family's plain all-reduce at a few sizes at each candidate
//!    CTA cap; per (rank count, family) the cap with the best total, ties to the smaller grid;
//! 2. the tables: every way AUTO can take, each family at the cap chosen in 1 (as AUTO will run
//!    it): each family's plain all-reduce and NCCL, and for the fused all-reduce + residual +
//!    RMSNorm each fused family, each family's split path (plain all-reduce, then the norm
//!    kernel) and NCCL then the norm kernel; every element type.
//!
//! Then, per (op, ranks, type, row width), the fastest way at each measured size ([`winners`]),
//! adjacent sizes with the same winner merged into one row ([`merge`]), sections that came out
//! identical for every type (or both row widths) written once ([`sections`]), the grid lines
//! that differ from the built-in caps, and the file with the machine's header; and a report
//! ([`report`]) beside it.

mod grid;
mod plan;
mod report;

use crate::case::{BiasMode, Case, Mode, Shape, Suite};
use crate::record::{Record, Status};
use crate::{gpu, stats, RunArgs, Swept};
use clap::Args;
use edgellm_allreduce::tuning::{
    library_id, GridCap, Machine, RowWidth, Section, SectionKey, TunedOp, Tuning, FILE_NAME,
};
use edgellm_allreduce::{DataType, Family, FusedChoice, LinkClass, Message, NARROW_ROW};
use edgellm_test_support as data;
use plan::Plan;
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
    /// Element types (a type whose tables match the others' is written once, as dtype=any)
    /// [bf16,fp16,fp32; --quick: bf16]. The grids are measured with the first.
    #[arg(long, value_delimiter = ',', value_parser = data::parse_dtype)]
    dtype: Vec<DataType>,
    /// Smallest plain message (powers of two from here).
    #[arg(long, default_value = "1K", value_parser = stats::parse_bytes)]
    min_bytes: u64,
    /// Largest plain message (sim: at most what the largest workspace serves: no NCCL there).
    #[arg(long, default_value = "64M", value_parser = stats::parse_bytes)]
    max_bytes: u64,
    /// Fused sweep: token counts [1,2,4,...,1024; --quick: 1,16,256].
    #[arg(long, value_delimiter = ',')]
    tokens: Vec<u64>,
    /// Fused sweep: hidden sizes (up to 4096 tunes the narrow rows, wider the wide ones).
    #[arg(long, value_delimiter = ',', default_value = "4096,8192")]
    hidden: Vec<u32>,
    /// Skip the fused op (its calls keep the built-in tables).
    #[arg(long)]
    no_fused: bool,
    /// Skip the grid sweep: the tables are measured at each family's built-in cap (or an
    /// already loaded file's), and the file has no grid lines.
    #[arg(long)]
    no_grid: bool,
    /// Grid sweep: the candidate caps (CTAs per rank), the group's own cap always added
    /// [1,2,4,8,16,32,64; --quick: 4,16].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=128), conflicts_with = "no_grid")]
    grid_ctas: Vec<u32>,
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
    /// faster); never a way slower than the fastest by more. Grid caps within it of the best
    /// total: the smallest.
    #[arg(long, default_value_t = 3.0)]
    tie_percent: f64,
    /// The tuning file to write [EDGELLM_ALLREDUCE_TUNING if set, else ./edgellm-allreduce-tuning.txt:
    /// copy it beside libNvInfer_edgellm_plugin.so, where the library looks for it].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The report to attach to a bug report: machine, links, NVML peer status, the probe's
    /// figures, grid caps, tables (plain text) [tune-report.txt beside the tuning file].
    #[arg(long)]
    report: Option<PathBuf>,
    /// A CSV of `edgellm-allreduce-bench probe` (--csv) on this machine, summarized in the report.
    #[arg(long, conflicts_with = "probe")]
    probe_csv: Option<PathBuf>,
    /// Probe the fabric first: `probe --quick` (every GPU pair's peer writes and reads, or GPU to
    /// host with one GPU) in a child process, its table printed, its CSV (probe.csv beside the
    /// tuning file) summarized in the report: the fabric's figures and the tuning in one command.
    #[arg(long)]
    probe: bool,
    /// Every measurement of the tables, as the benchmark's CSV; the grid sweep's go beside it
    /// (tune-grid.csv for tune.csv).
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
    /// Under a minute on one GPU in --mode sim with ranks 2,4,8 (some 260 measurements): grids
    /// at 4, 16 and the group's cap, at 16K and each family's largest size up to 1M; plain
    /// sizes x4 apart (1K, 4K, 16K, 64K, 256K, 1M, 4M) and the largest (sim: the largest a
    /// workspace serves); fused tokens 1, 16, 256; bf16 unless --dtype; 10 replays x (1
    /// warm-up + 5 timed) batches. Coarser tables than the full tune (crossovers within x4).
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

/// One of the two sweeps' options for `crate::sweep`: `strategies` over `sizes` (and `shapes`
/// when fused), every family at `grids`.
fn sweep_args(t: &TuneArgs, p: &Plan, dtype: Vec<DataType>, sweep: Sweep, grids: Vec<GridCap>) -> RunArgs {
    let (strategies, sizes, shapes, csv) = match sweep {
        Sweep::Grid => (p.grid_cases(), p.grid_sweep_sizes(), Vec::new(), grid_csv(&t.csv)),
        Sweep::Tables => (cases(t.mode, !p.shapes.is_empty()), p.sizes.clone(), p.shapes.clone(), t.csv.clone()),
    };
    RunArgs {
        mode: t.mode,
        ranks: p.ranks.clone(),
        dtype,
        min_bytes: t.min_bytes,
        max_bytes: t.max_bytes,
        sizes,
        suite: Some(if shapes.is_empty() { Suite::Plain } else { Suite::All }),
        strategies,
        fused: false,
        shapes,
        bias: BiasMode::Off,
        workspace_bytes: t.workspace_bytes,
        replays: Some(p.replays),
        graph_ops: p.graph_ops,
        batches: Some(p.batches),
        warmup: Some(p.warmup),
        no_eager: true,
        profiler: false,
        quick: t.quick,
        csv,
        plot: PathBuf::new(),
        no_plot: true,
        font: None,
        nccl_lib: t.nccl_lib.clone(),
        device: t.device,
        timeout: t.timeout,
        grids,
    }
}

#[derive(Clone, Copy)]
enum Sweep {
    Grid,
    Tables,
}

/// `tune-grid.csv` beside `tune.csv`.
fn grid_csv(csv: &Path) -> PathBuf {
    let stem = csv.file_stem().map_or_else(|| "tune".into(), |s| s.to_string_lossy().into_owned());
    csv.with_file_name(format!("{stem}-grid.csv"))
}

/// The arguments of `--probe`'s child: the quick probe, its CSV at `csv`.
fn probe_args(csv: &Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = ["probe", "--quick", "--csv"].map(Into::into).to_vec();
    args.push(csv.into());
    args
}

/// `--probe`: runs the quick probe in a child process (a wait that runs out ends the probe's
/// process, not this one, and every one of its waits is bounded) and returns its CSV's path, for
/// the report; a probe that fails is said here, and the report says what of its CSV it read.
fn probe_first(out: &Path) -> PathBuf {
    let csv = out.with_file_name("probe.csv");
    println!("probe: the fabric first (probe --quick), CSV {}", csv.display());
    let status =
        std::env::current_exe().and_then(|exe| std::process::Command::new(exe).args(probe_args(&csv)).status());
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!("warning: the probe ended with {s}: the report summarizes what its CSV holds"),
        Err(e) => eprintln!("warning: the probe could not start: {e}"),
    }
    println!();
    csv
}

/// `tune-report.txt` beside the tuning file.
fn report_path(t: &TuneArgs, out: &Path) -> PathBuf {
    t.report.clone().unwrap_or_else(|| out.with_file_name("tune-report.txt"))
}

pub fn run(mut t: TuneArgs) -> i32 {
    let gpus = gpu::device_count();
    let plan = match Plan::resolve(&t, gpus) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let tie = t.tie_percent / 100.0;
    let out = t.out.clone().unwrap_or_else(default_out);
    if t.probe {
        t.probe_csv = Some(probe_first(&out));
    }
    // The library read its settings and any tuning file when it was loaded: that file's grid
    // lines cap the fused kernels measured here (the plain launches take the caps given).
    if std::env::var_os("EDGELLM_ALLREDUCE_TUNING").is_some_and(|p| Path::new(&p).is_file()) {
        println!(
            "note: EDGELLM_ALLREDUCE_TUNING names an existing file: its grid lines cap the fused_ rows measured here; unset it to tune from the built-in caps"
        );
    }
    // What the run costs, by the bench's timing model (sim, 132 SMs shared by the ranks).
    let e = plan.estimate(&|n| (132 / n.max(1) as u32).clamp(1, 128));
    let seconds =
        if t.mode == Mode::Sim { format!(", about {:.0} s by the timing model", e.seconds) } else { String::new() };
    println!(
        "tune: {} measurements ({} grid, {} plain, {} fused){seconds}",
        e.measurements(),
        e.grid,
        e.plain,
        e.fused
    );

    let mut choices: Vec<grid::Choice> = Vec::new();
    if plan.grid.is_some() {
        let args = sweep_args(&t, &plan, vec![plan.grid_dtype()], Sweep::Grid, Vec::new());
        let Swept { records, outcome } = match crate::sweep(&args) {
            Ok(swept) => swept,
            Err(code) => return code,
        };
        if let Err(e) = outcome {
            eprintln!(
                "error: the grid sweep stopped: {}; no tuning file written (measurements so far: {})",
                e.0,
                args.csv.display()
            );
            write_report(&t, &plan, &out, None, &[], Err(format!("the grid sweep stopped: {}", e.0)));
            return 2;
        }
        let failed = records.iter().filter(|r| r.status == Status::Failed).count();
        if failed > 0 {
            eprintln!("warning: {failed} grid row(s) FAILED their correctness check: those caps are left out");
        }
        choices = grid::choices(&grid::points(&records), tie, &|n, f| plan.grid_sizes(n, f));
        println!("\ngrid caps ({}; CSV {}):", data::dtype_name(plan.grid_dtype()), args.csv.display());
        for c in &choices {
            let totals: Vec<String> = c.totals.iter().map(|(ctas, us)| format!("{ctas}: {us:.1} µs")).collect();
            println!(
                "  {} ranks {:<8} {:>3} CTAs  (totals over {} sizes: {})",
                c.nranks,
                c.family.name(),
                c.ctas,
                c.sizes.len(),
                totals.join(", ")
            );
        }
        for &n in &plan.ranks {
            for f in Family::ALL.into_iter().filter(|f| !choices.iter().any(|c| c.nranks == n && c.family == *f)) {
                println!("  {n} ranks {:<8} no cap measured at every size: its built-in cap", f.name());
            }
        }
    }

    let args = sweep_args(&t, &plan, plan.dtypes.clone(), Sweep::Tables, grid::applied(&choices));
    let Swept { records, outcome } = match crate::sweep(&args) {
        Ok(swept) => swept,
        Err(code) => return code,
    };
    print!("{}", crate::record::table(&records));
    if let Err(e) = outcome {
        eprintln!("error: the run stopped: {}; no tuning file written (measurements so far: {})", e.0, t.csv.display());
        write_report(&t, &plan, &out, None, &choices, Err(format!("the run stopped: {}", e.0)));
        return 2;
    }
    let failed = records.iter().filter(|r| r.status == Status::Failed).count();
    if failed > 0 {
        eprintln!("warning: {failed} row(s) FAILED their correctness check: those ways are left out of the tables");
    }
    // After the sweeps: the driver is initialised by now, after the environment was set for it.
    let links = match links_of(t.mode, t.device, groups_of(t.mode, t.device, &plan.ranks)) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            write_report(&t, &plan, &out, None, &choices, Err(e));
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
    let measured: Vec<Measurement> =
        measurements(&records).into_iter().filter(|m| links.kept.contains(&m.nranks)).collect();
    let tuning = Tuning {
        machine,
        links: links.class,
        library: library_id(),
        grids: grid::lines(&choices, links.class, &links.kept),
        sections: sections(&measured, tie),
    };
    let slower = slower_than_measured(&measured, &tuning, tie);
    let invalid = tuning
        .validate()
        .err()
        .map(|e| e.to_string())
        .or_else(|| (!slower.is_empty()).then(|| format!("rows keep ways measured slower: {}", slower.join("; "))));
    if let Some(e) = invalid {
        eprintln!("error: the measurements give no valid tables ({e}); nothing written");
        let why = format!("the measurements give no valid tables ({e})");
        write_report(&t, &plan, &out, Some((&tuning, &links.groups)), &choices, Err(why));
        return 2;
    }
    let grids = match (&plan.grid, tuning.grids.len()) {
        (None, _) => "no grid sweep".to_owned(),
        (Some(_), 0) => "grids measured, every family's built-in cap kept".to_owned(),
        (Some(_), n) => format!("grids measured, {n} cap(s) other than the built-in"),
    };
    let note = format!(
        "# edgellm-allreduce-bench tune --mode {}: graph replay, {} ops per graph, median over batches; ties within {}%; {grids}\n",
        t.mode.name(),
        plan.graph_ops,
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
    let outcome = Ok((out.display().to_string(), tuning.fingerprint()));
    write_report(&t, &plan, &out, Some((&tuning, &links.groups)), &choices, outcome);
    0
}

/// Writes the report (and says where); `done`: the tuning as written or refused, and the groups'
/// links (None: the run stopped short of them: the report asks the driver itself).
fn write_report(
    t: &TuneArgs,
    p: &Plan,
    out: &Path,
    done: Option<(&Tuning, &[report::Group])>,
    grids: &[grid::Choice],
    outcome: Result<(String, u64), String>,
) {
    let path = report_path(t, out);
    let stopped;
    let (tuning, groups) = match done {
        Some(x) => x,
        None => {
            let machine = match Machine::current() {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("warning: no report: describing this machine: {e}");
                    return;
                }
            };
            let groups = groups_of(t.mode, t.device, &p.ranks);
            let links = match (t.mode, groups.iter().max_by_key(|g| g.nranks)) {
                (Mode::Real, Some(g)) => edgellm_allreduce::group_class(&g.facts),
                _ => LinkClass::SameDevice,
            };
            stopped =
                (Tuning { machine, links, library: library_id(), grids: Vec::new(), sections: Vec::new() }, groups);
            (&stopped.0, &stopped.1[..])
        }
    };
    let bus_ids: Vec<String> = tuning.machine.gpus.iter().map(|g| g.bus_id.clone()).collect();
    let p2p = report::p2p_pairs(&bus_ids);
    let probe = t.probe_csv.as_ref().map(|csv| {
        let read = std::fs::read_to_string(csv).map_err(|e| e.to_string());
        (csv.display().to_string(), read.and_then(|text| crate::probe::csv_summary(&text)))
    });
    let timing = format!(
        "graph replay, {} ops per graph, {} replays x {} batches (+{} warm-up), median; ties within {}%",
        p.graph_ops, p.replays, p.batches, p.warmup, t.tie_percent
    );
    let facts = report::Facts {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        mode: t.mode,
        timing,
        tuning,
        outcome,
        groups,
        p2p: &p2p,
        probe,
        grids,
    };
    match write_atomically(&path, &report::text(&facts)) {
        Ok(()) => println!("report: {} (attach it to a bug report)", path.display()),
        Err(e) => eprintln!("warning: writing the report {}: {e}", path.display()),
    }
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

/// The links of the measured groups.
struct Links {
    /// The class the tables are for.
    class: LinkClass,
    /// The rank counts measured on it.
    kept: Vec<i32>,
    /// Every rank count's group (the report's).
    groups: Vec<report::Group>,
}

/// Each rank count's group as the runners form it (sim: every rank on `device`; real: GPUs
/// 0..n) and the driver's facts of its links.
fn groups_of(mode: Mode, device: i32, ranks: &[i32]) -> Vec<report::Group> {
    let group = |n: i32| {
        let devices: Vec<i32> = if mode == Mode::Sim { vec![device; n as usize] } else { (0..n).collect() };
        let facts = edgellm_allreduce::pair_facts(&devices, edgellm_allreduce::link_facts);
        report::Group { nranks: n, devices, facts }
    };
    ranks.iter().map(|&n| group(n)).collect()
}

/// The links the tables are for, and the rank counts measured on them: sim, one device; real,
/// the class of the largest group, with the rank counts whose group has the same class (the
/// others, said, keep the built-in tables).
fn links_of(mode: Mode, device: i32, groups: Vec<report::Group>) -> Result<Links, String> {
    let ranks: Vec<i32> = groups.iter().map(|g| g.nranks).collect();
    if mode == Mode::Sim {
        println!("{} ranks on GPU {device}: {}", ranks.len(), edgellm_allreduce::describe_links(&groups[0].facts));
        return Ok(Links { class: LinkClass::SameDevice, kept: ranks, groups });
    }
    for g in &groups {
        println!("{} ranks on GPUs {:?}: {}", g.nranks, g.devices, edgellm_allreduce::describe_links(&g.facts));
    }
    let classes: Vec<(i32, LinkClass)> =
        groups.iter().map(|g| (g.nranks, edgellm_allreduce::group_class(&g.facts))).collect();
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
    Ok(Links { class: links, kept, groups })
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

/// A fixed order of the ways, for exact ties: NCCL, each fused family, each split family (in
/// `Family::ALL`'s order, however many families there are).
fn order(way: FusedChoice) -> usize {
    let at = |f: Family| Family::ALL.iter().position(|&g| g == f).unwrap_or(0);
    match way {
        FusedChoice::Nccl => 0,
        FusedChoice::Fused(f) => 1 + at(f),
        FusedChoice::Split(f) => 1 + Family::ALL.len() + at(f),
    }
}

/// Each size's ways with their time (several timings of one way at one size averaged), the
/// fastest first (exact ties in [`order`]), sizes ascending.
fn by_size(points: &[(u64, FusedChoice, f64)]) -> BTreeMap<u64, Vec<(FusedChoice, f64)>> {
    let mut sums: BTreeMap<u64, Vec<(FusedChoice, f64, u32)>> = BTreeMap::new();
    for &(bytes, way, us) in points {
        let at = sums.entry(bytes).or_default();
        match at.iter_mut().find(|(w, _, _)| *w == way) {
            Some((_, sum, n)) => (*sum, *n) = (*sum + us, *n + 1),
            None => at.push((way, us, 1)),
        }
    }
    sums.into_iter()
        .map(|(bytes, ways)| {
            let mut ways: Vec<(FusedChoice, f64)> = ways.into_iter().map(|(w, sum, n)| (w, sum / n as f64)).collect();
            ways.sort_by(|a, b| a.1.total_cmp(&b.1).then(order(a.0).cmp(&order(b.0))));
            (bytes, ways)
        })
        .collect()
}

/// Whether `way` was measured among `ways` (one size's) and no way there beat it by more than
/// `tie` (a fraction): the only ways a table may keep at that size.
fn within_tie(ways: &[(FusedChoice, f64)], way: FusedChoice, tie: f64) -> bool {
    let Some(best) = ways.iter().map(|w| w.1).min_by(f64::total_cmp) else {
        return false;
    };
    ways.iter().any(|&(w, us)| w == way && us <= best * (1.0 + tie.max(0.0)))
}

/// The way AUTO should take at each measured size of one table: `(bytes, way, µs)` points
/// (several of one way at one size are averaged), sizes ascending. Ways within `tie` (a
/// fraction) of the fastest are tied: the previous size's winner stays, else NCCL, else the
/// fastest (exact ties in a fixed order). The previous winner is judged at this size only:
/// measured slower here than another way by more than `tie`, it goes, however it fared before
/// (issue 42: a tuned file never keeps a way the same run measured slower).
pub fn winners(points: &[(u64, FusedChoice, f64)], tie: f64) -> Vec<(u64, FusedChoice)> {
    let mut out: Vec<(u64, FusedChoice)> = Vec::new();
    for (bytes, ways) in by_size(points) {
        let Some(&(fastest, _)) = ways.first() else {
            continue;
        };
        let tied = |w: FusedChoice| within_tie(&ways, w, tie);
        let previous = out.last().map(|&(_, w)| w).filter(|&w| tied(w));
        let nccl = Some(FusedChoice::Nccl).filter(|&w| tied(w));
        out.push((bytes, previous.or(nccl).unwrap_or(fastest)));
    }
    out
}

/// Every measured size where `tuning` takes a way that is not within `tie` of the fastest way
/// measured there (as the library reads the file: a type's own section, else `dtype=any`;
/// a row width's own, else `rows=any`). None for a file [`sections`] made; checked before
/// writing all the same.
pub fn slower_than_measured(measured: &[Measurement], tuning: &Tuning, tie: f64) -> Vec<String> {
    type Key = (TunedOp, i32, usize, Option<RowWidth>);
    let mut points: BTreeMap<Key, Vec<(u64, FusedChoice, f64)>> = BTreeMap::new();
    for m in measured {
        points.entry((m.op, m.nranks, dtype_index(m.dtype), m.width)).or_default().push((m.bytes, m.way, m.us));
    }
    let mut out = Vec::new();
    for ((op, nranks, d, width), p) in points {
        // Any row of the width's class: the choice reads its class, not its tokens.
        let rows = width.map(|w| (1, if w == RowWidth::Wide { 2 * NARROW_ROW } else { NARROW_ROW }));
        for (bytes, ways) in by_size(&p) {
            let message = Message { bytes, rows };
            let Some(taken) = tuning.choice(tuning.links, nranks, DTYPES[d], &message) else {
                continue;
            };
            if !within_tie(&ways, taken, tie) {
                let (fastest, best) = ways[0];
                let us = ways.iter().find(|w| w.0 == taken).map_or("not measured".into(), |w| format!("{:.2} us", w.1));
                out.push(format!(
                    "{op:?} {nranks} ranks {} {} {}: {taken:?} ({us}) against {fastest:?} ({best:.2} us)",
                    data::dtype_name(DTYPES[d]),
                    width.map_or(String::new(), |w| format!("{w:?}")),
                    stats::fmt_bytes(bytes)
                ));
            }
        }
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
    fn probe_first_runs_the_quick_probe_into_a_csv_beside_the_tuning_file() {
        let args = probe_args(Path::new("/lib/probe.csv"));
        assert_eq!(args, ["probe", "--quick", "--csv", "/lib/probe.csv"]);
        // The child's arguments are the probe's own.
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            c: Sub,
        }
        #[derive(clap::Subcommand)]
        enum Sub {
            Probe(crate::probe::ProbeArgs),
        }
        let Sub::Probe(p) =
            <Cli as clap::Parser>::try_parse_from(std::iter::once("bench".into()).chain(args)).unwrap().c;
        assert!(p.quick && p.csv == Path::new("/lib/probe.csv"));
        // --probe and --probe-csv say two things of one CSV: refused.
        #[derive(clap::Parser)]
        struct Tune {
            #[command(flatten)]
            t: TuneArgs,
        }
        assert!(<Tune as clap::Parser>::try_parse_from(["tune", "--probe", "--probe-csv", "p.csv"]).is_err());
        assert!(<Tune as clap::Parser>::try_parse_from(["tune", "--probe"]).unwrap().t.probe);
    }

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
    fn a_slower_family_is_not_carried_over() {
        // Issue 42: Lamport won at 1 KiB; at 4 KiB the one-shot is 10% faster: Lamport goes,
        // whatever it did before.
        let p = [(1024, L, 5.0), (1024, O, 6.0), (4096, L, 6.6), (4096, O, 6.0)];
        assert_eq!(winners(&p, 0.03), [(1024, L), (4096, O)]);
        // A chain of small losses stays tied size by size, never beyond the tie of that size.
        let p = [(1024, L, 5.0), (1024, O, 5.1), (2048, L, 5.1), (2048, O, 5.0), (4096, L, 5.4), (4096, O, 5.0)];
        assert_eq!(winners(&p, 0.03), [(1024, L), (2048, L), (4096, O)]);
        // Averaged timings are judged as averages: Lamport's 4.0 and 7.0 (5.5) lose to 5.0.
        let p = [(1024, L, 5.0), (1024, O, 5.2), (4096, L, 4.0), (4096, L, 7.0), (4096, O, 5.0)];
        assert_eq!(winners(&p, 0.03), [(1024, L), (4096, O)]);
        // The previous winner not measured at a size (it does not serve it) does not stay.
        let p = [(1024, L, 5.0), (1024, O, 6.0), (8 << 20, O, 60.0), (8 << 20, Nccl, 61.0)];
        assert_eq!(winners(&p, 0.03), [(1024, L), (8 << 20, Nccl)]);
        // Push, the fourth family, orders apart from the split ways on exact ties.
        let push = Fused(Family::Push);
        assert_ne!(order(push), order(Split(Family::OneShot)));
        let p = [(1024, Split(Family::OneShot), 5.0), (1024, push, 5.0)];
        assert_eq!(winners(&p, 0.0), [(1024, push)]);
    }

    #[test]
    fn every_written_row_is_within_the_tie_of_the_fastest() {
        // Pseudo-random timings for four ways over 12 sizes, two types: whatever the tie, each
        // measured size's way as the file says it is within the tie of the fastest there.
        let ways = [L, O, T, Nccl];
        let mut seed = 0x9e37_79b9_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            5.0 + (seed % 1000) as f64 / 100.0
        };
        let mut ms = Vec::new();
        for d in [DataType::Bf16, DataType::Half] {
            for p in 10..22 {
                for w in ways {
                    ms.push(m(TunedOp::Plain, 2, d, None, 1 << p, w, next()));
                }
            }
        }
        for tie in [0.0, 0.03, 0.1, 0.5] {
            let t = Tuning { sections: sections(&ms, tie), ..tuning(Vec::new()) };
            assert!(slower_than_measured(&ms, &t, tie).is_empty(), "tie {tie}");
        }
        // A file that keeps a way measured slower is caught.
        let t = tuning(vec![Section {
            key: SectionKey { op: TunedOp::Plain, nranks: 2, dtype: None, width: None },
            rows: vec![(u64::MAX, T)],
        }]);
        let ms = [
            m(TunedOp::Plain, 2, DataType::Bf16, None, 1024, T, 6.0),
            m(TunedOp::Plain, 2, DataType::Bf16, None, 1024, L, 5.0),
        ];
        assert_eq!(slower_than_measured(&ms, &t, 0.03).len(), 1);
        assert!(slower_than_measured(&ms, &t, 0.25).is_empty());
    }

    fn tuning(sections: Vec<Section>) -> Tuning {
        Tuning {
            machine: Machine {
                host: "h".into(),
                driver: "d".into(),
                gpus: vec![edgellm_allreduce::tuning::Gpu { bus_id: "0000:01:00.0".into(), name: "G".into() }],
            },
            links: LinkClass::Pcie,
            library: library_id(),
            grids: Vec::new(),
            sections,
        }
    }

    #[test]
    fn a_file_with_grid_lines_reads_back() {
        // The grid sweep's choices, through the lines tune writes, the file's text (with tune's
        // comment line) and the library's parser.
        let choice = |nranks, family, ctas, group_max| grid::Choice {
            nranks,
            family,
            sizes: vec![16 << 10, 1 << 20],
            totals: vec![(ctas, 10.0)],
            ctas,
            group_max: Some(group_max),
        };
        let choices = [
            choice(2, Family::Push, 8, 132),
            choice(2, Family::Lamport, 132, 132),
            choice(4, Family::TwoShot, 16, 132),
            choice(8, Family::OneShot, 2, 132),
        ];
        let ms = [m(TunedOp::Plain, 2, DataType::Bf16, None, 1024, L, 5.0)];
        let t = Tuning { grids: grid::lines(&choices, LinkClass::Pcie, &[2, 4]), ..tuning(sections(&ms, 0.03)) };
        assert_eq!(
            t.grids,
            [
                GridCap { nranks: 2, family: Family::Push, ctas: 8 },
                GridCap { nranks: 4, family: Family::TwoShot, ctas: 16 }
            ],
            "the default (Lamport at the group's cap) and the rank count not kept are left out"
        );
        let text = "# edgellm-allreduce-bench tune --mode real: ...\n".to_owned() + &t.to_text();
        assert!(text.contains("grid ranks=2 push ctas=8\n") && text.contains(" grids=2\n"), "{text}");
        let back = Tuning::parse(&text).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.fingerprint(), t.fingerprint());
        t.validate().unwrap();
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
        let t = tuning(s);
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
        // Transport is measured through the families: the staged push (PCIe's) with the pulls.
        for c in [Case::Custom(Family::Push), Case::Fused(Family::Push), Case::Split(Family::Push)] {
            assert!(cases(Mode::Real, true).contains(&c) && cases(Mode::Sim, true).contains(&c));
        }
        for c in cases(Mode::Real, true) {
            assert!(way_of(c.name()).is_some(), "{}", c.name());
        }
    }
}
