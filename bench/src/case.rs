//! What one benchmark row measures.

use edgellm_allreduce::{DataType, Family};

/// One strategy row of a sweep. A plain row is one all-reduce of `bytes` per call; a fused row
/// is one all-reduce + residual (+ bias) + RMSNorm of a `tokens × hidden` [`Shape`] per call
/// (every kernel of the op in the one call). A row that cannot run at a size (the family does
/// not serve it, no NCCL, AUTO picks NCCL in simulation) is reported as `n/a`.
///
/// Adding a row: a variant here, its `name`, list it in [`Case::all`] (and `runs_in`), then
/// handle it where the compiler points: `sim::plan` / `real::Shared::plan` (plain) or
/// `sim::plan_fused` / `real::Shared::plan_fused` (fused: can it run at this shape, with
/// which kernels), the runners' `enqueue` (one call) and the reference of the check
/// (`edgellm_test_support::generate` sums the inputs; `edgellm_test_support::fused_reference`
/// derives the fused outputs).
/// Timing, graphs, CSV, table and plot need no change: they only see a row name.
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
    /// Fused: one fused all-reduce + residual + RMSNorm kernel of a family
    /// (`Group::launch_fused`).
    Fused(Family),
    /// Fused: what AUTO picks for the fused message: a fused family, or NCCL then the
    /// residual + RMSNorm kernel (real mode; `n/a` in simulation).
    FusedAuto,
    /// Fused baseline: AUTO's plain custom all-reduce for the size (`Group::launch` into a
    /// temporary buffer), then a separate residual + RMSNorm kernel (`FusedCall::launch_norm`).
    ArThenNorm,
    /// Fused baseline: `ncclAllReduce` (x into normed), then the residual + RMSNorm kernel in
    /// place: the plugin's NCCL path (real mode only).
    NcclThenNorm,
    /// Fused: `PluginCore::enqueue` of a fused plugin (AUTO, fusion_op RESIDUAL_RMS_NORM)
    /// after registering the communicators (real mode only).
    PluginFused,
    /// Fused, the split path of one family: its plain all-reduce into a temporary buffer, then
    /// the residual + RMSNorm kernel (what AUTO runs for `FusedChoice::Split`). Measured by
    /// `tune` for every family; not a default row (`ar_then_norm` shows AUTO's).
    Split(Family),
    /// A family's plain all-reduce with at most this many CTAs (`Group::launch_with_ctas`), or
    /// [`GROUP_MAX`] the group's own cap: `tune`'s grid sweep, `--strategies lamport@8`. The
    /// record's `path` says the grid that ran (`lamport@66`). Not in [`Case::all`].
    Grid(Family, u32),
}

/// [`Case::Grid`]'s CTAs for "the group's own cap" (`lamport@max`).
pub const GROUP_MAX: u32 = u32::MAX;

impl Case {
    pub fn name(self) -> &'static str {
        match self {
            Case::Nccl => "nccl",
            Case::Custom(f) => f.name(),
            Case::Auto => "auto",
            Case::Plugin => "plugin",
            Case::Fused(f) => family_row_name("fused_", f),
            Case::FusedAuto => "fused_auto",
            Case::ArThenNorm => "ar_then_norm",
            Case::NcclThenNorm => "nccl_then_norm",
            Case::PluginFused => "plugin_fused",
            Case::Split(f) => family_row_name("split_", f),
            Case::Grid(f, ctas) => leak(grid_name(f, ctas)),
        }
    }

    /// A row's name, or `<family>@<ctas>` / `<family>@max` ([`Case::Grid`], 1 to 128 CTAs).
    pub fn parse(s: &str) -> Option<Case> {
        let s = s.trim();
        if let Some((family, ctas)) = s.split_once('@') {
            let family = Family::ALL.into_iter().find(|f| f.name().eq_ignore_ascii_case(family.trim()))?;
            let ctas = match ctas.trim() {
                "max" => GROUP_MAX,
                n => n.parse().ok().filter(|c| (1..=MAX_CTAS).contains(c))?,
            };
            return Some(Case::Grid(family, ctas));
        }
        Case::all().into_iter().find(|c| c.name().eq_ignore_ascii_case(s))
    }

    /// Every row, in the order of the tables: each family's rows in `Family::ALL`'s order.
    pub fn all() -> Vec<Case> {
        let families = |row: fn(Family) -> Case| Family::ALL.map(row);
        [vec![Case::Nccl], families(Case::Custom).to_vec(), vec![Case::Auto, Case::Plugin]]
            .into_iter()
            .chain([families(Case::Fused).to_vec()])
            .chain([vec![Case::FusedAuto, Case::ArThenNorm, Case::NcclThenNorm, Case::PluginFused]])
            .chain([families(Case::Split).to_vec()])
            .flatten()
            .collect()
    }

    /// The rows of a mode and sweep (fused or plain) when `--strategies` is not given.
    pub fn defaults(mode: Mode, fused: bool) -> Vec<Case> {
        Case::all()
            .into_iter()
            .filter(|c| c.runs_in(mode) && c.is_fused() == fused && !matches!(c, Case::Split(_)))
            .collect()
    }

    pub fn runs_in(self, mode: Mode) -> bool {
        match self {
            Case::Nccl | Case::Plugin | Case::NcclThenNorm | Case::PluginFused => mode == Mode::Real,
            _ => true,
        }
    }

    /// A row of the fused sweep (all-reduce + residual + RMSNorm of a shape).
    pub fn is_fused(self) -> bool {
        matches!(
            self,
            Case::Fused(_)
                | Case::FusedAuto
                | Case::ArThenNorm
                | Case::NcclThenNorm
                | Case::PluginFused
                | Case::Split(_)
        )
    }

    /// AUTO and the plugin choose among the others: they are not candidates for "best".
    pub fn is_meta(self) -> bool {
        matches!(self, Case::Auto | Case::Plugin | Case::FusedAuto | Case::PluginFused)
    }

    /// The unfused baselines of the fused sweep: not candidates for "best fused" either.
    pub fn is_baseline(self) -> bool {
        matches!(self, Case::ArThenNorm | Case::NcclThenNorm | Case::Split(_))
    }

    /// Rows whose table cell shows the path taken (what AUTO / the plugin picked, or which
    /// plain family ran before the norm).
    pub fn shows_path(self) -> bool {
        self.is_meta() || self == Case::ArThenNorm
    }
}

/// The kernels' largest grid (`EAR_MAX_BLOCKS`): a [`Case::Grid`] asks for 1 to this many CTAs.
pub const MAX_CTAS: u32 = 128;

/// `prefix` + the family's name ("fused_push").
fn family_row_name(prefix: &'static str, family: Family) -> &'static str {
    leak(format!("{prefix}{}", family.name()))
}

/// `lamport@8`, `lamport@max`: a [`Case::Grid`]'s name, and (with the group's cap in place of
/// `max`) the path its record says ran.
pub fn grid_name(family: Family, ctas: u32) -> String {
    match ctas {
        GROUP_MAX => format!("{}@max", family.name()),
        c => format!("{}@{c}", family.name()),
    }
}

/// A row name made at run time, leaked once per distinct name (a few dozen at most: families
/// times row kinds and grid sizes).
fn leak(name: String) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&known) = names.iter().find(|n| **n == name) {
        return known;
    }
    let name: &'static str = Box::leak(name.into_boxed_str());
    names.push(name);
    name
}

/// Whether a row name (from a run or a CSV) is a fused row; unknown names are not.
pub fn is_fused_name(strategy: &str) -> bool {
    Case::parse(strategy).is_some_and(|c| c.is_fused())
}

/// Which sweeps a run makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    /// The plain all-reduce sweep over message sizes.
    Plain,
    /// The fused all-reduce + residual + RMSNorm sweep over tokens × hidden shapes.
    Fused,
    /// Both.
    All,
}

impl Suite {
    pub fn plain(self) -> bool {
        self != Suite::Fused
    }
    pub fn fused(self) -> bool {
        self != Suite::Plain
    }
}

/// Which fused shapes get a bias input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BiasMode {
    /// Half of the shapes, in a checkerboard over (tokens, hidden): with the default shapes,
    /// every token count and every hidden size is measured both with and without.
    Half,
    /// Every shape with a bias.
    On,
    /// No bias.
    Off,
    /// Every shape twice, without and with.
    Both,
}

/// One fused call's shape: `tokens` rows of `hidden` elements, with or without a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub tokens: u64,
    pub hidden: u32,
    pub bias: bool,
}

impl Shape {
    pub fn count(&self) -> usize {
        self.tokens as usize * self.hidden as usize
    }
    pub fn bytes(&self, dtype: DataType) -> u64 {
        (self.count() * dtype.size()) as u64
    }
    /// "8x4096", "8x4096+bias": the CSV's `shape` column and the table's first column.
    pub fn label(&self) -> String {
        format!("{}x{}{}", self.tokens, self.hidden, if self.bias { "+bias" } else { "" })
    }
    pub fn parse_label(s: &str) -> Option<Shape> {
        let (dims, bias) = match s.trim().strip_suffix("+bias") {
            Some(d) => (d, true),
            None => (s.trim(), false),
        };
        let (tokens, hidden) = parse_dims(dims).ok()?;
        Some(Shape { tokens, hidden, bias })
    }
}

/// "8x4096" (tokens × hidden, both > 0).
pub fn parse_dims(s: &str) -> Result<(u64, u32), String> {
    let bad = || format!("'{s}' is not a shape TOKENSxHIDDEN (e.g. 8x4096)");
    let (t, h) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
    let tokens: u64 = t.trim().parse().map_err(|_| bad())?;
    let hidden: u32 = h.trim().parse().map_err(|_| bad())?;
    if tokens == 0 || hidden == 0 {
        return Err(bad());
    }
    Ok((tokens, hidden))
}

/// The default shapes of the fused sweep: decode, tokens {1, 8, 32, 128} × hidden {4096, 8192}.
pub const DEFAULT_SHAPES: [(u64, u32); 8] =
    [(1, 4096), (1, 8192), (8, 4096), (8, 8192), (32, 4096), (32, 8192), (128, 4096), (128, 8192)];

/// The shapes of the sweep: `dims` sorted by (tokens, hidden), deduplicated, with the bias
/// given by `bias`.
pub fn shapes(dims: &[(u64, u32)], bias: BiasMode) -> Vec<Shape> {
    let mut dims = dims.to_vec();
    dims.sort_unstable();
    dims.dedup();
    let mut tokens: Vec<u64> = dims.iter().map(|d| d.0).collect();
    tokens.dedup();
    let mut hiddens: Vec<u32> = dims.iter().map(|d| d.1).collect();
    hiddens.sort_unstable();
    hiddens.dedup();
    let mut out = Vec::new();
    for (t, h) in dims {
        let checker =
            (tokens.iter().position(|&x| x == t).unwrap() + hiddens.iter().position(|&x| x == h).unwrap()) % 2 == 1;
        let with = match bias {
            BiasMode::Half => vec![checker],
            BiasMode::On => vec![true],
            BiasMode::Off => vec![false],
            BiasMode::Both => vec![false, true],
        };
        out.extend(with.into_iter().map(|b| Shape { tokens: t, hidden: h, bias: b }));
    }
    out
}

/// The CTAs a [`Case::Grid`] row of `ctas` launches with on a group whose cap is `max_blocks`,
/// or why it does not run: a cap at or above the group's would measure the `@max` row again.
pub fn grid_ctas(ctas: u32, max_blocks: u32) -> Result<u32, String> {
    match ctas {
        GROUP_MAX => Ok(max_blocks),
        c if c >= max_blocks => Err(format!("the group takes at most {max_blocks} CTAs (the @max row)")),
        c => Ok(c),
    }
}

/// The plain all-reduce call AUTO decides on (aligned buffers: the benchmark's are).
pub fn plain_call(tp_size: i32, dtype: DataType, bytes: u64) -> edgellm_allreduce::Call {
    let message = edgellm_allreduce::Message { bytes, rows: None };
    edgellm_allreduce::Call { tp_size, dtype, message, aligned: true }
}

/// The fused call AUTO decides on.
pub fn fused_call(tp_size: i32, dtype: DataType, shape: &Shape) -> edgellm_allreduce::Call {
    let message = edgellm_allreduce::Message { bytes: shape.bytes(dtype), rows: Some((shape.tokens, shape.hidden)) };
    edgellm_allreduce::Call { tp_size, dtype, message, aligned: true }
}

/// Short name of a path actually taken (the `path` column, and the tag of AUTO/plugin cells).
pub fn path_name(path: edgellm_allreduce::Path) -> &'static str {
    use edgellm_allreduce::Path;
    match path {
        Path::Copy => "copy",
        Path::Nccl => "nccl",
        Path::Custom(f) => Case::Custom(f).name(),
        Path::Split(f) => Case::Custom(f).name(),
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
        for c in Case::all() {
            assert_eq!(Case::parse(c.name()), Some(c));
        }
        assert_eq!(Case::parse(" OneShot "), Some(Case::Custom(Family::OneShot)));
        assert_eq!(Case::parse("fast"), None);
        // One row per family (Family::ALL's order), then AUTO's.
        let families = |prefix: &str| Family::ALL.iter().map(|f| format!("{prefix}{}", f.name())).collect::<Vec<_>>();
        let names = |cases: Vec<Case>| cases.iter().map(|c| c.name().to_owned()).collect::<Vec<_>>();
        assert_eq!(names(Case::defaults(Mode::Sim, false)), [families(""), vec!["auto".into()]].concat());
        assert_eq!(Case::defaults(Mode::Real, false).len(), Family::ALL.len() + 3);
        assert!(Case::Auto.is_meta() && Case::Plugin.is_meta() && !Case::Nccl.is_meta());
        assert_eq!(
            names(Case::defaults(Mode::Sim, true)),
            [families("fused_"), vec!["fused_auto".into(), "ar_then_norm".into()]].concat()
        );
        assert_eq!(Case::defaults(Mode::Real, true).len(), Family::ALL.len() + 4);
        assert_eq!(Case::Fused(Family::Push).name(), "fused_push", "made once, the same every time");
        assert!(Case::FusedAuto.is_meta() && Case::PluginFused.is_meta() && Case::ArThenNorm.is_baseline());
        assert!(Case::ArThenNorm.shows_path() && !Case::Fused(Family::Lamport).shows_path());
        assert!(is_fused_name("nccl_then_norm") && !is_fused_name("nccl") && !is_fused_name("floor"));
        assert!(is_fused_name("split_twoshot") && Case::Split(Family::Lamport).is_baseline());
        // Grid rows: any family at 1..128 CTAs or the group's cap; plain, candidates, not listed.
        assert_eq!(Case::parse("Lamport@8"), Some(Case::Grid(Family::Lamport, 8)));
        assert_eq!(Case::parse("push@max"), Some(Case::Grid(Family::Push, GROUP_MAX)));
        for bad in ["lamport@0", "lamport@129", "lamport@", "fast@8", "nccl@8"] {
            assert_eq!(Case::parse(bad), None, "{bad}");
        }
        for c in [Case::Grid(Family::OneShot, 16), Case::Grid(Family::TwoShot, GROUP_MAX)] {
            assert_eq!(Case::parse(c.name()), Some(c));
            assert!(!c.is_fused() && !c.is_meta() && !c.is_baseline() && c.runs_in(Mode::Sim));
        }
        assert!(!Case::all().iter().any(|c| matches!(c, Case::Grid(..))));
    }

    #[test]
    fn shapes_parse_and_the_bias_checkerboard() {
        assert_eq!(parse_dims("8x4096"), Ok((8, 4096)));
        assert_eq!(parse_dims(" 128X8192 "), Ok((128, 8192)));
        assert!(parse_dims("8").is_err() && parse_dims("0x4096").is_err() && parse_dims("8x").is_err());
        let all = shapes(&DEFAULT_SHAPES, BiasMode::Half);
        assert_eq!(all.len(), 8);
        assert_eq!(all.iter().filter(|s| s.bias).count(), 4);
        for t in [1, 8, 32, 128] {
            assert_eq!(all.iter().filter(|s| s.tokens == t && s.bias).count(), 1, "each token count once with a bias");
        }
        for h in [4096, 8192] {
            assert_eq!(all.iter().filter(|s| s.hidden == h && s.bias).count(), 2, "each hidden size twice with a bias");
        }
        assert_eq!(all[0].label(), "1x4096");
        assert_eq!(all[1].label(), "1x8192+bias");
        for s in &all {
            assert_eq!(Shape::parse_label(&s.label()), Some(*s));
        }
        assert_eq!(shapes(&[(8, 4096), (1, 4096), (8, 4096)], BiasMode::Both).len(), 4);
        assert!(shapes(&DEFAULT_SHAPES, BiasMode::On).iter().all(|s| s.bias));
        assert_eq!(all[7].bytes(DataType::Bf16), 128 * 8192 * 2);
    }
}
