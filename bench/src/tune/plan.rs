//! What a `tune` run measures (its options resolved), the rows of its two sweeps, and what they
//! will cost by the bench's timing method ([`Plan::estimate`]).

use super::{cases, grid, TuneArgs};
use crate::case::{Case, Mode, GROUP_MAX};
use crate::stats;
use edgellm_allreduce::{DataType, Family, RANK_COUNTS};

/// A tune's measurements.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub mode: Mode,
    pub ranks: Vec<i32>,
    pub dtypes: Vec<DataType>,
    pub quick: bool,
    /// The grid sweep's candidate caps (with [`GROUP_MAX`]); None: no grid sweep.
    pub grid: Option<Vec<u32>>,
    /// The tables' plain sizes.
    pub sizes: Vec<u64>,
    /// The tables' fused shapes (tokens, hidden); empty: no fused op.
    pub shapes: Vec<(u64, u32)>,
    pub replays: u32,
    pub batches: u32,
    pub warmup: u32,
    pub graph_ops: u32,
    pub workspace_bytes: Option<u64>,
}

impl Plan {
    /// The run `t` asks for on a machine of `gpus` GPUs.
    pub fn resolve(t: &TuneArgs, gpus: i32) -> Result<Plan, String> {
        let ranks = match (t.mode, t.ranks.is_empty()) {
            (_, false) => t.ranks.clone(),
            (Mode::Sim, true) => vec![2, 4, 8],
            (Mode::Real, true) => RANK_COUNTS.into_iter().filter(|&n| n <= gpus).collect(),
        };
        if ranks.is_empty() {
            return Err(format!(
                "real mode needs 2 or more GPUs; this machine has {gpus} (tune --mode sim tunes simulated ranks)"
            ));
        }
        let dtypes = match (t.dtype.is_empty(), t.quick) {
            (false, _) => t.dtype.clone(),
            (true, false) => vec![DataType::Bf16, DataType::Half, DataType::Float],
            (true, true) => vec![DataType::Bf16],
        };
        let tokens: Vec<u64> = match (t.tokens.is_empty(), t.quick) {
            (false, _) => t.tokens.clone(),
            (true, false) => (0..=10).map(|p| 1u64 << p).collect(),
            (true, true) => vec![1, 16, 256],
        };
        let shapes = if t.no_fused {
            Vec::new()
        } else {
            tokens.iter().flat_map(|&k| t.hidden.iter().map(move |&h| (k, h))).collect()
        };
        let mut plan = Plan {
            mode: t.mode,
            ranks,
            dtypes,
            quick: t.quick,
            grid: (!t.no_grid).then(|| grid::candidates(&t.grid_ctas, t.quick)),
            sizes: Vec::new(),
            shapes,
            replays: t.replays.unwrap_or(if t.quick { 10 } else { 50 }).max(1),
            batches: t.batches.unwrap_or(if t.quick { 5 } else { 15 }).max(1),
            warmup: t.warmup.unwrap_or(if t.quick { 1 } else { 3 }),
            graph_ops: t.graph_ops.max(1),
            workspace_bytes: t.workspace_bytes,
        };
        // Simulation has no NCCL: no way runs above what the largest workspace serves.
        let max = match t.mode {
            Mode::Sim => t.max_bytes.min(plan.largest_served()),
            Mode::Real => t.max_bytes,
        };
        let elem = plan.dtypes.iter().map(|d| d.size() as u64).max().unwrap_or(2);
        plan.sizes = stats::sizes(t.min_bytes, max, elem, false);
        if t.quick {
            // x4 apart, not the smoke run's x16: the crossovers of the decode sizes (8-256 KiB)
            // fall between 16K and 256K (4 ranks on one H100: Lamport to 128K, 8 ranks to 48K;
            // docs/runs/2026-12-06-h100-tune-quick.txt), and a table can only switch at a size
            // it measured.
            let last = plan.sizes.last().copied();
            plan.sizes = plan.sizes.iter().copied().step_by(2).chain(last).collect();
            plan.sizes.dedup();
        }
        if plan.sizes.is_empty() {
            return Err(format!("no message size between {} and {max} bytes", t.min_bytes));
        }
        Ok(plan)
    }

    /// The custom workspace's largest message on `nranks` ranks, as the runners size it.
    pub fn workspace(&self, nranks: i32) -> u64 {
        self.workspace_bytes.map_or_else(|| edgellm_allreduce::max_message_bytes(nranks), |b| b.div_ceil(16) * 16)
    }

    fn largest_served(&self) -> u64 {
        let served = |n: i32| Family::ALL.iter().map(move |f| f.max_bytes(self.workspace(n)));
        self.ranks.iter().flat_map(|&n| served(n)).max().unwrap_or(0)
    }

    /// The type the grids are measured with (caps are per rank count and family, not per type).
    pub fn grid_dtype(&self) -> DataType {
        self.dtypes[0]
    }

    /// The sizes of `family`'s grid on `nranks` ranks.
    pub fn grid_sizes(&self, nranks: i32, family: Family) -> Vec<u64> {
        grid::sizes(family.max_bytes(self.workspace(nranks)), self.quick)
    }

    /// Every size of the grid sweep (a family is also measured at another's sizes that it serves,
    /// and those timings are left out: only with a workspace under 1 MiB do they differ).
    pub fn grid_sweep_sizes(&self) -> Vec<u64> {
        let mut all: Vec<u64> =
            self.ranks.iter().flat_map(|&n| Family::ALL.into_iter().flat_map(move |f| self.grid_sizes(n, f))).collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The grid sweep's rows: every family at every candidate.
    pub fn grid_cases(&self) -> Vec<Case> {
        let caps = self.grid.clone().unwrap_or_default();
        Family::ALL.into_iter().flat_map(|f| caps.iter().map(move |&c| Case::Grid(f, c))).collect()
    }

    /// Every measurement the run makes (a row that cannot run at a size is not one), and the
    /// seconds they take by [`cost`]'s model. `group_max(n)`: the group's CTA cap on n ranks.
    pub fn estimate(&self, group_max: &dyn Fn(i32) -> u32) -> Estimate {
        let mut e = Estimate::default();
        let ops = u64::from((self.warmup + self.batches) * self.replays * self.graph_ops);
        let measure = |e: &mut Estimate, n: i32, bytes: u64, ctas: u32| {
            e.seconds += cost::MEASUREMENT_S + ops as f64 * cost::op_us(n, bytes, ctas) * 1e-6;
            e.seconds += 2.0 * cost::host_s(n, bytes);
        };
        // Two sweeps (grid, tables), each with its setup per rank count.
        let sweeps = if self.grid.is_some() { 2.0 } else { 1.0 };
        e.seconds += cost::START_S + sweeps * self.ranks.len() as f64 * cost::RANKS_SETUP_S;
        for &n in &self.ranks {
            let served = |f: Family, bytes: u64| bytes <= f.max_bytes(self.workspace(n));
            let max = group_max(n);
            for bytes in self.grid.as_ref().map(|_| self.grid_sweep_sizes()).unwrap_or_default() {
                e.seconds += cost::host_s(n, bytes);
                for case in self.grid_cases() {
                    let Case::Grid(f, c) = case else { continue };
                    if served(f, bytes) && (c == GROUP_MAX || c < max) {
                        e.grid += 1;
                        measure(&mut e, n, bytes, c.min(max));
                    }
                }
            }
            for &dtype in &self.dtypes {
                for &bytes in &self.sizes {
                    e.seconds += cost::host_s(n, bytes);
                    for case in cases(self.mode, false) {
                        if matches!(case, Case::Nccl) || matches!(case, Case::Custom(f) if served(f, bytes)) {
                            e.plain += 1;
                            measure(&mut e, n, bytes, max);
                        }
                    }
                }
                for &(tokens, hidden) in &self.shapes {
                    let bytes = tokens * u64::from(hidden) * dtype.size() as u64;
                    e.seconds += 2.0 * cost::host_s(n, bytes);
                    for case in cases(self.mode, true).into_iter().filter(|c| c.is_fused()) {
                        let runs = match case {
                            Case::Fused(f) | Case::Split(f) => served(f, bytes),
                            _ => true,
                        };
                        if runs {
                            e.fused += 1;
                            measure(&mut e, n, bytes, max);
                        }
                    }
                }
            }
        }
        e
    }
}

/// What a run will take.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    pub grid: usize,
    pub plain: usize,
    pub fused: usize,
    pub seconds: f64,
}

impl Estimate {
    pub fn measurements(&self) -> usize {
        self.grid + self.plain + self.fused
    }
}

/// The bench's timing method as a cost model, for sizing `--quick` (simulated ranks on one
/// H100/H200). Each measurement is two checks (poison, one op, synchronize, download, compare
/// on the host) and one graph captured, then (warmup + batches) x replays x graph-ops ops
/// (`crate::measure`; tune takes no eager timing). The per-op figures are the sim runs of
/// `docs/runs/2026-12-03-h200-tune-sim.txt` (2 ranks: 3.9-6.4 µs up to 2 MiB, 140 µs at 64 MiB,
/// the fork/join floor 2 µs); the rest are round, pessimistic guesses, not measurements.
pub mod cost {
    /// The process: CUDA context, the kernels' modules, the 256 MiB copy roofline.
    pub const START_S: f64 = 5.0;
    /// Per rank count and sweep: the group (workspaces, self-test), buffers, the floor row.
    pub const RANKS_SETUP_S: f64 = 1.0;
    /// Per measurement besides its ops: two checks, a graph of graph-ops ops captured and
    /// instantiated.
    pub const MEASUREMENT_S: f64 = 0.025;
    /// One op of a small message: the fork/join floor and the kernel.
    pub const OP_US: f64 = 6.0;
    /// Bytes per µs the ranks' kernels move together through one GPU's memory (n² x size per
    /// op: 2 ranks x 64 MiB in 134 µs on top of [`OP_US`]).
    pub const MEMORY_BYTES_PER_US: f64 = 2e6;
    /// Bytes per µs one CTA moves (a small grid is bound by its CTAs, not by memory).
    pub const CTA_BYTES_PER_US: f64 = 25e3;
    /// Bytes per µs of host work per rank's buffer: inputs generated, fp64 reference, compare.
    pub const HOST_BYTES_PER_US: f64 = 500.0;

    /// One op of `bytes` on `n` simulated ranks of `ctas` CTAs each (µs).
    pub fn op_us(n: i32, bytes: u64, ctas: u32) -> f64 {
        let n = f64::from(n);
        let rate = MEMORY_BYTES_PER_US.min(n * f64::from(ctas.max(1)) * CTA_BYTES_PER_US);
        OP_US + n * n * bytes as f64 / rate
    }

    /// Host work on every rank's buffer of `bytes` (s).
    pub fn host_s(n: i32, bytes: u64) -> f64 {
        f64::from(n) * bytes as f64 / HOST_BYTES_PER_US * 1e-6
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        t: TuneArgs,
    }

    pub(crate) fn plan(line: &str) -> Plan {
        let args = std::iter::once("tune").chain(line.split_whitespace());
        Plan::resolve(&Cli::try_parse_from(args).unwrap().t, 8).unwrap()
    }

    /// H100 and H200: 132 SMs, shared by the simulated ranks.
    fn sim_max(n: i32) -> u32 {
        (132 / n as u32).min(128)
    }

    #[test]
    fn quick_in_sim_fits_a_minute() {
        let p = plan("--mode sim --quick");
        assert_eq!(p.ranks, [2, 4, 8]);
        assert_eq!(p.dtypes, [DataType::Bf16], "--quick: bf16 unless --dtype");
        assert_eq!(p.grid.as_deref(), Some(&[4, 16, GROUP_MAX][..]));
        assert_eq!((p.replays, p.batches, p.warmup, p.graph_ops), (10, 5, 1, 20));
        assert_eq!(p.grid_sizes(2, Family::Lamport), [16 << 10, 1 << 20]);
        assert!(p.sizes.len() <= 8 && p.shapes.len() == 6, "{:?} {:?}", p.sizes, p.shapes);
        assert!(p.sizes.iter().all(|&s| s <= 16 << 20), "nothing above every workspace in sim: {:?}", p.sizes);
        let e = p.estimate(&sim_max);
        // 3 rank counts x each family: 2 sizes x 2-3 caps of grid, 8 sizes plain, 6 shapes x 2
        // ways fused, less what the families do not serve (a new family adds its share).
        let families = Family::ALL.len();
        assert!(e.grid <= 18 * families && e.plain <= 24 * families && e.fused <= 36 * families, "{e:?}");
        assert!(e.measurements() <= 75 * families, "{e:?}");
        assert!(e.seconds <= 60.0, "the quick tune must stay about a minute: {e:?}");
        // The full sweep is an order larger (what --quick saves).
        let full = plan("--mode sim").estimate(&sim_max);
        assert!(full.measurements() > 5 * e.measurements() && full.seconds > 5.0 * e.seconds, "{full:?} {e:?}");
        // No grid sweep: fewer measurements, the same tables.
        let no_grid = plan("--mode sim --quick --no-grid");
        assert_eq!((no_grid.grid.clone(), no_grid.sizes.clone()), (None, p.sizes.clone()));
        assert_eq!(no_grid.estimate(&sim_max).grid, 0);
    }

    #[test]
    fn the_grid_sweep_covers_every_family_and_candidate() {
        let p = plan("--mode sim --ranks 2 --grid-ctas 8,1 --no-fused --dtype fp16,bf16");
        assert_eq!(p.grid_dtype(), DataType::Half, "the first type given");
        assert_eq!(p.grid.as_deref(), Some(&[1, 8, GROUP_MAX][..]));
        assert_eq!(p.grid_cases().len(), Family::ALL.len() * 3);
        assert!(Family::ALL.iter().all(|&f| p.grid_cases().contains(&Case::Grid(f, GROUP_MAX))));
        assert_eq!(p.grid_sweep_sizes(), [16 << 10, 256 << 10, 1 << 20]);
        assert!(p.shapes.is_empty());
        // The group's cap is measured once: a candidate at or above it is skipped.
        let e = p.estimate(&|_| 8);
        assert_eq!(e.grid, Family::ALL.len() * 3 * 2);
        // A small workspace: each family at its own largest size.
        let p = plan("--mode sim --ranks 2 --workspace-bytes 512K");
        assert_eq!(p.grid_sizes(2, Family::OneShot), [16 << 10, 256 << 10, 512 << 10]);
        // Real mode keeps the sizes above the workspaces (NCCL runs there).
        assert_eq!(plan("--mode real --quick").sizes.last(), Some(&(64 << 20)));
        assert_eq!(plan("--mode real").ranks, [2, 4, 6, 8], "the rank counts 8 GPUs form");
    }

    #[test]
    fn the_cost_model() {
        // 2 ranks: a few µs small, 140 µs at 64 MiB (the sim run the model is taken from).
        assert!((cost::op_us(2, 1024, 66) - 6.0).abs() < 0.1);
        assert!((cost::op_us(2, 64 << 20, 66) - 140.2).abs() < 1.0);
        assert!(cost::op_us(2, 1 << 20, 1) > 10.0 * cost::op_us(2, 1 << 20, 66) / 2.0, "one CTA is slow");
    }
}
