//! edgellm-allreduce-bench: latency and bandwidth of the custom all-reduce kernels, AUTO, the
//! plugin path and NCCL, on simulated ranks (one GPU) or real ones (one GPU per rank). See
//! bench/README.md.

mod case;
mod fused;
mod gpu;
mod measure;
mod nccl;
mod plot;
mod probe;
mod real;
mod record;
mod sim;
mod stats;
mod tune;

use case::{BiasMode, Case, Mode, Shape, Suite};
use clap::{Args, Parser, Subcommand};
use edgellm_allreduce::tuning::GridCap;
use edgellm_allreduce::{DataType, Family};
use measure::{Settings, Sink};
use record::Status;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Parser)]
#[command(
    name = "edgellm-allreduce-bench",
    version,
    about = "Benchmark of edgellm-allreduce's all-reduce paths (custom kernels, AUTO, plugin, NCCL)",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Makes the PNG from an existing CSV (no GPU needed).
    Plot {
        #[arg(long, default_value = "bench.csv")]
        csv: PathBuf,
        #[arg(long, default_value = "bench.png")]
        plot: PathBuf,
        /// TrueType font for the text (default: DejaVu Sans or another common font).
        #[arg(long)]
        font: Option<PathBuf>,
    },
    /// Prints the table of an existing CSV (no GPU needed).
    Table {
        #[arg(long, default_value = "bench.csv")]
        csv: PathBuf,
    },
    /// Measures every way AUTO can take on this machine and writes the library's tuning file
    /// (AUTO's tables for these GPUs and links).
    Tune(tune::TuneArgs),
    /// Measures a link: SM stores and loads across it (bandwidth against CTAs, size, one or
    /// both directions), copy-engine copies, round trips. --mode host: a GPU against pinned host
    /// memory over its PCIe link; --mode peers: every pair of GPUs with peer access.
    Probe(probe::ProbeArgs),
}

#[derive(Args)]
struct RunArgs {
    /// sim: N simulated ranks on one GPU; real: one GPU per rank.
    #[arg(long, value_enum, default_value_t = Mode::Sim)]
    mode: Mode,
    /// Rank counts, comma-separated [sim: 2,4,8; real: every GPU of the machine].
    #[arg(long, value_delimiter = ',')]
    ranks: Vec<i32>,
    /// Element types: bf16, fp16, fp32 (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "bf16", value_parser = edgellm_test_support::parse_dtype)]
    dtype: Vec<DataType>,
    /// Smallest message (bytes; K, M, G are powers of 1024).
    #[arg(long, default_value = "1K", value_parser = stats::parse_bytes)]
    min_bytes: u64,
    /// Largest message.
    #[arg(long, default_value = "64M", value_parser = stats::parse_bytes)]
    max_bytes: u64,
    /// Explicit message sizes instead of the powers of two from --min-bytes to --max-bytes.
    #[arg(long, value_delimiter = ',', value_parser = stats::parse_bytes)]
    sizes: Vec<u64>,
    /// Rows: nccl, oneshot, twoshot, lamport, push, auto, plugin; a family at a grid:
    /// lamport@8 (at most 8 CTAs), lamport@max (the group's cap); fused: fused_oneshot,
    /// fused_twoshot, fused_lamport, fused_push, fused_auto, ar_then_norm, nccl_then_norm,
    /// plugin_fused, split_<family> [all of the mode's but the split_ and @ rows, for the sweeps
    /// that run].
    #[arg(long, value_delimiter = ',', value_parser = parse_case)]
    strategies: Vec<Case>,
    /// Sweeps: plain (all-reduce over message sizes), fused (all-reduce + residual + RMSNorm
    /// over tokens x hidden shapes), all [plain; fused when --strategies names only fused rows;
    /// all when it names both].
    #[arg(long, value_enum)]
    suite: Option<Suite>,
    /// Same as --suite fused.
    #[arg(long, conflicts_with = "suite")]
    fused: bool,
    /// Fused sweep: shapes TOKENSxHIDDEN, comma-separated [1x4096,1x8192,8x4096,8x8192,
    /// 32x4096,32x8192,128x4096,128x8192].
    #[arg(long, value_delimiter = ',', value_parser = case::parse_dims)]
    shapes: Vec<(u64, u32)>,
    /// Fused sweep: which shapes have a bias input: half (a checkerboard over tokens x hidden),
    /// on, off, both (every shape twice).
    #[arg(long, value_enum, default_value_t = BiasMode::Half)]
    bias: BiasMode,
    /// Largest message the custom workspaces take [the library's default: 16 MB at 2 ranks,
    /// 8 MB above]; e.g. 64M to cover the whole default sweep. Also given to the plugin's group
    /// (EDGELLM_ALLREDUCE_WORKSPACE_BYTES).
    #[arg(long, value_parser = stats::parse_bytes)]
    workspace_bytes: Option<u64>,
    /// Calls per timed batch [50; --quick: 10].
    #[arg(long)]
    replays: Option<u32>,
    /// All-reduces (or fused ops) captured back to back in each graph; times are per op. 1
    /// charges every op a whole graph launch; the peer figures of anchors-2xh200.md used 20.
    #[arg(long, default_value_t = 1)]
    graph_ops: u32,
    /// Timed batches; the median is over them [15; --quick: 5].
    #[arg(long)]
    batches: Option<u32>,
    /// Untimed batches first [3; --quick: 1].
    #[arg(long)]
    warmup: Option<u32>,
    /// Skip the eager (direct launch) timing.
    #[arg(long)]
    no_eager: bool,
    /// Run under Nsight Compute with `--graph-profiling graph`, which serializes every launch
    /// outside a graph: no start gate, no eager launch (implies --no-eager), the first check
    /// through a one-op graph. Small sizes may then be bound by the host's launch rate.
    #[arg(long)]
    profiler: bool,
    /// Smoke run: sizes ×16 apart, fewer replays and batches.
    #[arg(long)]
    quick: bool,
    /// CSV output, one row per (mode, ranks, dtype, bytes, strategy).
    #[arg(long, default_value = "bench.csv")]
    csv: PathBuf,
    /// PNG output: latency against size.
    #[arg(long, default_value = "bench.png")]
    plot: PathBuf,
    /// Do not draw the PNG.
    #[arg(long)]
    no_plot: bool,
    /// TrueType font for the plot's text.
    #[arg(long)]
    font: Option<PathBuf>,
    /// NCCL library for real mode [libnccl.so.2 from the loader's path].
    #[arg(long)]
    nccl_lib: Option<String>,
    /// The GPU of simulation mode.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Seconds without progress after which the run is declared hung (exit 3).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// The grids of the plain launches of the family, split_ and ar_then_norm rows, per rank
    /// count and family (tune sets them to the caps it chose); none listed: `Group::launch`'s cap.
    #[arg(skip)]
    grids: Vec<GridCap>,
}

fn parse_case(s: &str) -> Result<Case, String> {
    Case::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Case::all().iter().map(|c| c.name()).collect();
        format!("unknown strategy '{s}' ({})", names.join(", "))
    })
}

/// What a run measures (resolved options).
pub struct Plan {
    pub ranks: Vec<i32>,
    pub dtypes: Vec<DataType>,
    /// The plain sweep's message sizes (empty: no plain sweep).
    pub sizes: Vec<u64>,
    /// The plain sweep's rows.
    pub cases: Vec<Case>,
    /// The fused sweep's shapes (empty: no fused sweep).
    pub shapes: Vec<Shape>,
    /// The fused sweep's rows.
    pub fused_cases: Vec<Case>,
    pub settings: Settings,
    pub workspace_bytes: Option<u64>,
    pub device: i32,
    /// Grids of the family and split rows ([`Plan::ctas`]).
    pub grids: Vec<GridCap>,
}

impl Plan {
    /// The most CTAs `family`'s plain launches take on `nranks` ranks when a grid is given for
    /// them (`Group::launch_with_ctas`); None: `Group::launch`'s own cap.
    pub fn ctas(&self, nranks: i32, family: Family) -> Option<u32> {
        self.grids.iter().find(|g| g.nranks == nranks && g.family == family).map(|g| g.ctas)
    }

    /// Every row of one rank count: (dtype, bytes, case, shape label) of the plain sweep, or of
    /// the fused one.
    pub fn rows(&self, fused: bool) -> Vec<(DataType, u64, Case, String)> {
        let mut out = Vec::new();
        for &dtype in &self.dtypes {
            if fused {
                for shape in &self.shapes {
                    out.extend(self.fused_cases.iter().map(|&c| (dtype, shape.bytes(dtype), c, shape.label())));
                }
            } else {
                for &bytes in &self.sizes {
                    out.extend(self.cases.iter().map(|&c| (dtype, bytes, c, String::new())));
                }
            }
        }
        out
    }
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Some(Command::Plot { csv, plot, font }) => {
            read_csv(&csv).map_or(2, |records| draw(&records, &plot, font.as_deref()))
        }
        Some(Command::Table { csv }) => read_csv(&csv).map_or(2, |records| {
            print!("{}", record::table(&records));
            0
        }),
        Some(Command::Tune(t)) => tune::run(t),
        Some(Command::Probe(p)) => probe::run(p),
        None => run(cli.run),
    };
    std::process::exit(code);
}

fn read_csv(path: &Path) -> Option<Vec<record::Record>> {
    let parsed = std::fs::read_to_string(path).map_err(anyhow::Error::from).and_then(|t| record::parse_csv(&t));
    parsed.map_err(|e| eprintln!("error: {}: {e}", path.display())).ok()
}

/// Draws the PNG; 0, or 2 if it could not be written.
fn draw(records: &[record::Record], path: &Path, font: Option<&Path>) -> i32 {
    match plot::render(records, path, font) {
        Ok(Some(f)) => {
            eprintln!("plot: {} (font {})", path.display(), f.display());
            0
        }
        Ok(None) => {
            eprintln!("plot: {} without text: no font found (give one with --font)", path.display());
            0
        }
        Err(e) => {
            eprintln!("plot: {e}");
            2
        }
    }
}

fn env_set(key: &str, value: &str) {
    // Edition 2021: safe. Called before any thread or CUDA/NCCL initialisation.
    std::env::set_var(key, value);
}

/// What a sweep measured: every row, and whether the run went to its end.
struct Swept {
    records: Vec<record::Record>,
    outcome: Result<(), measure::Fatal>,
}

fn run(a: RunArgs) -> i32 {
    let Swept { records, outcome } = match sweep(&a) {
        Ok(swept) => swept,
        Err(code) => return code,
    };
    print!("{}", record::table(&records));
    println!("\nCSV: {}", a.csv.display());
    let mut code = 0;
    if !a.no_plot && draw(&records, &a.plot, a.font.as_deref()) != 0 {
        code = 2;
    }
    let failed = records.iter().filter(|r| r.status == Status::Failed).count();
    let errors = records.iter().filter(|r| r.status == Status::Error).count();
    if let Err(e) = &outcome {
        eprintln!("error: the run stopped: {}", e.0);
        code = 2;
    }
    if failed > 0 {
        eprintln!("{failed} row(s) FAILED their correctness check");
        code = code.max(1);
    }
    if errors > 0 {
        eprintln!("{errors} row(s) had an error");
        code = 2;
    }
    code
}

/// Runs the sweeps `a` asks for (the `run` without a subcommand, and `tune`'s measurements);
/// Err: the exit status of an argument or setup error, already said.
fn sweep(a: &RunArgs) -> Result<Swept, i32> {
    // The environment first: CUDA reads CUDA_DEVICE_MAX_CONNECTIONS when a context is created,
    // NCCL reads NCCL_* when it initialises, the library reads EDGELLM_* when a group forms.
    if a.mode == Mode::Sim {
        // Up to N rank streams must run concurrently on one GPU: with the default of 8 hardware
        // queues, two ranks' streams could share one, serialize, and spin forever.
        let current = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok().and_then(|v| v.parse::<u32>().ok());
        if current.is_none_or(|c| c < 32) {
            env_set("CUDA_DEVICE_MAX_CONNECTIONS", "32");
        }
    } else {
        // No NVLink multicast (NVLS) objects: NCCL's NVLS algorithms are switched off.
        env_set("NCCL_NVLS_ENABLE", "0");
        // The communicators are registered from one thread, as Edge-LLM does; an exchange at
        // registration (a collective) would wait forever for the ranks not registered yet.
        if std::env::var("EDGELLM_ALLREDUCE_EXCHANGE").is_ok_and(|v| v == "register") {
            println!("environment: EDGELLM_ALLREDUCE_EXCHANGE=register ignored (one thread registers every device)");
            std::env::remove_var("EDGELLM_ALLREDUCE_EXCHANGE");
        }
    }
    if let Some(ws) = a.workspace_bytes {
        env_set("EDGELLM_ALLREDUCE_WORKSPACE_BYTES", &ws.to_string());
    }

    let quick = a.quick;
    let settings = Settings {
        replays: a.replays.unwrap_or(if quick { 10 } else { 50 }).max(1),
        graph_ops: a.graph_ops.max(1),
        batches: a.batches.unwrap_or(if quick { 5 } else { 15 }).max(1),
        warmup: a.warmup.unwrap_or(if quick { 1 } else { 3 }),
        eager: !a.no_eager && !a.profiler,
        profiler: a.profiler,
    };
    let suite = match (a.fused, a.suite) {
        (true, _) => Suite::Fused,
        (false, Some(s)) => s,
        (false, None) => {
            match (a.strategies.iter().any(|c| !c.is_fused()), a.strategies.iter().any(|c| c.is_fused())) {
                (false, true) => Suite::Fused,
                (true, true) => Suite::All,
                _ => Suite::Plain,
            }
        }
    };
    let pick = |fused: bool| -> Vec<Case> {
        if a.strategies.is_empty() {
            Case::defaults(a.mode, fused)
        } else {
            a.strategies.iter().copied().filter(|c| c.is_fused() == fused).collect()
        }
    };
    let cases: Vec<Case> = if suite.plain() { pick(false) } else { Vec::new() };
    let fused_cases: Vec<Case> = if suite.fused() { pick(true) } else { Vec::new() };
    if cases.is_empty() && fused_cases.is_empty() {
        eprintln!("error: --strategies names no row of the {} sweep", format!("{suite:?}").to_lowercase());
        return Err(2);
    }
    for (runs, rows, name) in [(suite.plain(), &cases, "plain"), (suite.fused(), &fused_cases, "fused")] {
        if runs && rows.is_empty() {
            eprintln!("warning: --strategies names no row of the {name} sweep: it is skipped");
        }
    }
    let dims: &[(u64, u32)] = if a.shapes.is_empty() { &case::DEFAULT_SHAPES } else { &a.shapes };
    let shapes = if fused_cases.is_empty() { Vec::new() } else { case::shapes(dims, a.bias) };

    let elem = a.dtype.iter().map(|d| d.size() as u64).max().unwrap_or(2);
    let mut sizes: Vec<u64> = if cases.is_empty() {
        Vec::new()
    } else if a.sizes.is_empty() {
        stats::sizes(a.min_bytes, a.max_bytes, elem, quick)
    } else {
        a.sizes.iter().map(|s| s.div_ceil(elem) * elem).collect()
    };
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() && !cases.is_empty() {
        eprintln!("error: no message size between {} and {} bytes", a.min_bytes, a.max_bytes);
        return Err(2);
    }

    let gpus = gpu::device_count();
    if gpus == 0 {
        eprintln!("error: no CUDA device (or no libcuda)");
        return Err(2);
    }
    let ranks = if !a.ranks.is_empty() {
        a.ranks.clone()
    } else if a.mode == Mode::Sim {
        vec![2, 4, 8]
    } else {
        vec![gpus]
    };
    if a.mode == Mode::Sim {
        if let Some(bad) = ranks.iter().find(|n| !edgellm_allreduce::RANK_COUNTS.contains(n)) {
            eprintln!("error: --ranks {bad}: the kernels exist for {:?} ranks", edgellm_allreduce::RANK_COUNTS);
            return Err(2);
        }
        if a.device < 0 || a.device >= gpus {
            eprintln!("error: --device {}: this machine has {gpus} GPU(s)", a.device);
            return Err(2);
        }
    } else if gpus < 2 {
        eprintln!("error: real mode needs 2 or more GPUs; this machine has {gpus} (use --mode sim)");
        return Err(2);
    }
    let plan = Plan {
        ranks,
        dtypes: a.dtype.clone(),
        sizes,
        cases,
        shapes,
        fused_cases,
        settings,
        workspace_bytes: a.workspace_bytes,
        device: a.device,
        grids: a.grids.clone(),
    };

    let dtypes = plan.dtypes.iter().map(|d| edgellm_test_support::dtype_name(*d)).collect::<Vec<_>>().join(",");
    if !plan.cases.is_empty() {
        println!(
            "edgellm-allreduce-bench: mode {}, ranks {:?}, {dtypes}, {} sizes {}..{}, rows {}",
            a.mode.name(),
            plan.ranks,
            plan.sizes.len(),
            stats::fmt_bytes(plan.sizes[0]),
            stats::fmt_bytes(*plan.sizes.last().unwrap()),
            plan.cases.iter().map(|c| c.name()).collect::<Vec<_>>().join(",")
        );
    }
    if !plan.fused_cases.is_empty() {
        println!(
            "edgellm-allreduce-bench: mode {}, ranks {:?}, {dtypes}, fused all-reduce + residual + RMSNorm (eps {:e}), shapes {}, rows {}",
            a.mode.name(),
            plan.ranks,
            fused::eps(),
            plan.shapes.iter().map(|s| s.label()).collect::<Vec<_>>().join(","),
            plan.fused_cases.iter().map(|c| c.name()).collect::<Vec<_>>().join(",")
        );
    }
    println!(
        "timing: each CUDA graph holds {} all-reduce(s) back to back, times per op{}{}; {} replays per batch, {} warm-up + {} timed batches, median (p10, p90 in the CSV){}",
        settings.graph_ops,
        if a.mode == Mode::Sim { " (fork, N rank launches, join)" } else { ", one graph per device, batches started together" },
        if plan.fused_cases.is_empty() { "" } else { " or one complete fused op (all its kernels)" },
        settings.replays,
        settings.warmup,
        settings.batches,
        if settings.eager { "; eager: the same batches with direct launches" } else { "" }
    );
    if !plan.grids.is_empty() {
        let grids: Vec<String> =
            plan.grids.iter().map(|g| format!("{} ranks {}@{}", g.nranks, g.family.name(), g.ctas)).collect();
        println!("grids: {} (the family rows' plain launches)", grids.join(", "));
    }
    for var in [
        "EDGELLM_ALLREDUCE_STRATEGY",
        "EDGELLM_ALLREDUCE_MAX_BLOCKS",
        "EDGELLM_ALLREDUCE_PDL",
        "EDGELLM_ALLREDUCE_WORKSPACE_BYTES",
    ] {
        if let Ok(v) = std::env::var(var) {
            println!("environment: {var}={v}");
        }
    }

    let csv = match record::CsvWriter::create(&a.csv) {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!("error: creating {}: {e}", a.csv.display());
            return Err(2);
        }
    };
    gpu::watchdog::start(
        std::time::Duration::from_secs(a.timeout.max(5)),
        format!("rows so far are in {}", a.csv.display()),
    );
    let total = (plan.ranks.len() * (plan.rows(false).len() + plan.rows(true).len())) as u64;
    let sink = Mutex::new(Sink::new(csv, total));

    let outcome = match a.mode {
        Mode::Sim => sim::run(&plan, &sink),
        Mode::Real => {
            let (nccl, note) = match nccl::Nccl::load(a.nccl_lib.as_deref()) {
                Ok(l) => (Some(l), String::new()),
                Err(e) => {
                    sink.lock().unwrap().say(format!("warning: {e}; the NCCL and plugin rows are skipped"));
                    (None, e)
                }
            };
            // Never unloaded: NCCL's threads may outlive any point where that is safe.
            let nccl: Option<&'static nccl::Nccl> = nccl.map(|l| &*Box::leak(Box::new(l)));
            real::run(&plan, nccl, &note, &sink)
        }
    };
    let sink = sink.into_inner().unwrap();
    sink.bar.finish_and_clear();
    Ok(Swept { records: sink.records, outcome })
}
