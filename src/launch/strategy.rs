//! Which path runs an all-reduce: a copy (one rank), NCCL, or a custom kernel family.
//!
//! Every rank of a communicator must take the same path for the same call, so the choice is a
//! pure function of what all ranks share: the plugin's fields (or the environment override),
//! the message size, the group's rank count, workspace and devices (separate GPUs, or all on
//! one), and the tensor alignment (TensorRT lays out the same engine identically on every rank).
//!
//! AUTO picks by the group's links ([`Fits::link_class`]: one set of [`AutoTables`] per
//! [`LinkClass`]), rank count and message size: [`NVLINK_TABLES`] (measured on 2 x H200),
//! [`PCIE_TABLES`] (from a model: families that read from peers, NCCL for large messages),
//! [`SAME_DEVICE_TABLES`] (simulated ranks, where memory instead of the links carries the
//! bytes), NCCL when there is no peer access; a tuning file measured on this machine
//! (`crate::launch::tuning`) takes the place of the built-in tables of its link class. A family that
//! cannot serve a call (message over its workspace, unaligned tensors, no group) falls back to
//! the next larger family (on PCIe never to one that writes into its peers), then to NCCL. A
//! forced strategy that cannot run falls back to NCCL.

pub use crate::config::Requested;
use crate::launch::family::{Family, Op};
use crate::launch::{Fits, Message};
use crate::link::LinkClass;
use crate::tensor::DataType;
use crate::launch::tuning::Tuning;

/// Rows (first whose rank bound is >= the group's ranks) of entries (first whose byte bound is
/// >= the message's bytes).
pub(crate) type RankTable<T> = &'static [(i32, &'static [(u64, T)])];

/// AUTO's choice by rank count (first row whose bound is >= the group's ranks) and message size
/// (first entry whose bound is >= the bytes); `None` is NCCL. For ranks on separate GPUs joined
/// by NVLink; [`PCIE_AUTO_TABLE`] over PCIe, [`ONE_DEVICE_AUTO_TABLE`] when all share one device.
///
/// 2 ranks: measured on 2 x H200 (NV18), bf16, graph replay, 128 CTAs (docs/PERFORMANCE.md,
/// docs/runs/2026-11-30-2xh200-s2-final-real_g20.txt): Lamport is the fastest family up to
/// its 2 MiB cap, two-shot from there to 64 MiB (14.9 and 27.6 us at 4 and 8 MiB against
/// one-shot's 17.3 and 31.1, 52.3 at 16 MiB against 62.4 and NCCL's 76.7), NCCL above (the
/// workspace rarely goes past 64 MiB). 4 and more ranks: not yet measured on 4 or 8 GPUs. The
/// Lamport bounds come from the simulation (Lamport best up to 256 KiB at 4 ranks, 64 KiB at 8),
/// the one-shot / two-shot crossover from the bytes each pulls over the links, (N-1)*S against
/// 2(N-1)/N*S: at ~360 GB/s the two-shot's second barrier and gather (~3 us at 256 KiB in the
/// simulation's stage timings) pay for themselves from ~700 KB at 4 ranks and ~200 KB at 8
/// (vLLM switches at 512 KB and 256 KB). docs/PERFORMANCE.md, "Four and eight ranks".
pub(crate) const AUTO_TABLE: RankTable<Option<Family>> = &[
    (
        2,
        &[(2 << 20, Some(Family::Lamport)), (64 << 20, Some(Family::TwoShot)), (u64::MAX, None)],
    ),
    (
        4,
        &[(256 << 10, Some(Family::Lamport)), (512 << 10, Some(Family::OneShot)), (8 << 20, Some(Family::TwoShot)), (u64::MAX, None)],
    ),
    (
        16,
        &[(64 << 10, Some(Family::Lamport)), (256 << 10, Some(Family::OneShot)), (8 << 20, Some(Family::TwoShot)), (u64::MAX, None)],
    ),
];

/// AUTO's table when every rank is on one device ([`LinkClass::SameDevice`]: simulated ranks). There
/// one GPU's memory carries every byte of every rank, the local copy into the workspace
/// included, and a one-shot's N reads of each line are mostly one (the ranks read it from L2
/// together), so the one-shot moves about 4*S per rank when it copies its input and about 2*S
/// when its peers read it in place (a group of one process, sm_90: `EAR_CALL_POINTERS`), where
/// the links see (N-1)*S and 2(N-1)/N*S. Measured on one H200, bf16, 20 ops per graph: 2 ranks
/// (docs/runs/2026-12-01-h200-perf48-c2.txt) Lamport to 1 MiB, one-shot above (6.9 against
/// Lamport's 7.1 us at 2 MiB, 140 against the two-shot's 204 at 64 MiB); 4 and 8 ranks with
/// the inputs read in place (docs/runs/2026-12-01-h200-inplace-oneshot.txt): 4 ranks Lamport to
/// 128 KiB (5.95 against the one-shot's 6.21 us), the one-shot above (6.38 against 6.85 at 256
/// KiB, 177 against the two-shot's 198 at 64 MiB); 8 ranks Lamport to 64 KiB (level there: 9.0
/// both), the one-shot to 512 KiB (12.1 against 12.9), the two-shot above (14.2 against 15.7
/// at 1 MiB, 331 against 507 at 64 MiB).
pub(crate) const ONE_DEVICE_AUTO_TABLE: RankTable<Option<Family>> = &[
    (
        2,
        &[(1 << 20, Some(Family::Lamport)), (64 << 20, Some(Family::OneShot)), (u64::MAX, None)],
    ),
    (
        4,
        &[(128 << 10, Some(Family::Lamport)), (64 << 20, Some(Family::OneShot)), (u64::MAX, None)],
    ),
    (
        16,
        &[(64 << 10, Some(Family::Lamport)), (512 << 10, Some(Family::OneShot)), (64 << 20, Some(Family::TwoShot)), (u64::MAX, None)],
    ),
];

/// How AUTO runs the fused all-reduce + residual + RMSNorm at a size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedChoice {
    /// The family's fused kernel.
    Fused(Family),
    /// The family's plain all-reduce, then the separate residual + RMSNorm kernel: faster once
    /// the fused kernels' one-CTA-per-row epilogue is the bottleneck (many tokens).
    Split(Family),
    /// NCCL, then the residual + RMSNorm kernel.
    Nccl,
}

/// AUTO's table for the fused op, by the same keys as [`AUTO_TABLE`]. 2 ranks: measured on
/// 2 x H200 (docs/runs/2026-11-29-2xh200-gather-final-fused_g20.txt and -fused-big.txt, 128
/// CTAs): the fused Lamport kernel is the fastest up to its 2 MiB cap at 7 of 8 decode shapes
/// (3.9 against 4.3 us split at 1 x 4096, 10.9 against 11.5 at 128 x 8192; 0.2 us behind the
/// split path at 32 x 8192 + bias), the fused one-shot from there to 16 MiB (19.0, 34.5 and
/// 65.2 us at 256, 512 and 1024 x 8192 against the split two-shot's 22.3, 44.0 and 80.4).
/// 4 and more ranks: from the simulation (fused Lamport best up to 256 KiB at 4 ranks and
/// 8 KiB at 8, fused one-shot above).
pub(crate) const FUSED_AUTO_TABLE: RankTable<FusedChoice> = &[
    (
        2,
        &[
            (2 << 20, FusedChoice::Fused(Family::Lamport)),
            (16 << 20, FusedChoice::Fused(Family::OneShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        4,
        &[
            (256 << 10, FusedChoice::Fused(Family::Lamport)),
            (2 << 20, FusedChoice::Fused(Family::OneShot)),
            (8 << 20, FusedChoice::Split(Family::TwoShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        16,
        &[
            (8 << 10, FusedChoice::Fused(Family::Lamport)),
            (2 << 20, FusedChoice::Fused(Family::OneShot)),
            (8 << 20, FusedChoice::Split(Family::TwoShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
];

/// AUTO's tables for the fused op when every rank is on one device, for rows of up to 4096
/// elements and for wider rows: measured on one H200 with simulated ranks, every fused family
/// against the plain all-reduce then the norm kernel (the split path), at 2, 4 and 8 ranks, bf16,
/// decode shapes 1-512 x 4096 and 8192 (docs/runs/2026-12-03-h200-fused-auto.txt). Since the
/// one-shot reads its peers' inputs in place at 4+ ranks (and the fused one-shot copies), the
/// split path wins for wide rows from 512 KiB at 4 ranks (10.1 against 11.0 us at 32 x 8192, 22.4
/// against 24.2 at 128 x 8192) and from 16 KiB at 8 (10.9 against 12.2 at 1 x 8192, 46.2 against
/// 49.7 at 128 x 8192); for rows of 4096 the fused kernels stay ahead (15.3 against 16.2 at 4
/// ranks, 128 x 4096). Wider than 4096 was measured at 8192 only.
pub(crate) const ONE_DEVICE_FUSED_AUTO_TABLE: RankTable<FusedChoice> = &[
    (
        2,
        &[
            (2 << 20, FusedChoice::Fused(Family::Lamport)),
            (16 << 20, FusedChoice::Fused(Family::OneShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        4,
        &[
            (256 << 10, FusedChoice::Fused(Family::Lamport)),
            (16 << 20, FusedChoice::Fused(Family::OneShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        16,
        &[
            (64 << 10, FusedChoice::Fused(Family::Lamport)),
            (16 << 20, FusedChoice::Fused(Family::OneShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
];

/// [`ONE_DEVICE_FUSED_AUTO_TABLE`] for rows wider than [`NARROW_ROW`] elements.
pub(crate) const ONE_DEVICE_FUSED_AUTO_TABLE_WIDE: RankTable<FusedChoice> = &[
    (
        2,
        &[
            (1 << 20, FusedChoice::Fused(Family::Lamport)),
            (16 << 20, FusedChoice::Fused(Family::OneShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        4,
        &[
            (256 << 10, FusedChoice::Fused(Family::Lamport)),
            (16 << 20, FusedChoice::Split(Family::OneShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        16,
        &[
            (64 << 10, FusedChoice::Split(Family::Lamport)),
            (512 << 10, FusedChoice::Split(Family::OneShot)),
            (16 << 20, FusedChoice::Split(Family::TwoShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
];

/// The widest row (hidden size, elements) of the one-device fused tables' narrow class.
pub const NARROW_ROW: u32 = 4096;

/// AUTO's table over PCIe peer-to-peer (no NVLink), by the same keys as [`AUTO_TABLE`]. Not
/// measured yet (no PCIe machine here): written from a model, for `edgellm-allreduce-bench tune`
/// to replace on the machine itself (`crate::launch::tuning`).
///
/// The model. A PCIe x16 link carries ~25 GB/s per direction at Gen4 and ~50 at Gen5 (32 and
/// 64 raw; 25 GB/s measured at Gen4, ZaidQureshi/bam#54; <= 28.4 after TLP headers,
/// ai-dynamo/aiconfigurator#1301), and a hop costs ~1-2 us (a GPU-driven PCIe round trip
/// measured ~2 us, aiconfigurator#1301). NCCL's ring moves 2(N-1)/N x S per rank at about the bus bandwidth
/// but pays ~20-45 us at small sizes (36 us at TP16, local-inference-lab/b12x#139; 45 us at 4 KB
/// on 8 x RTX 6000D, sgl-project/sglang#32479). Three rules follow.
///
/// 1. Read from peers, do not write into them. A one-shot pulls (N-1) x S (its peers' staged
///    inputs) and the 4+ rank two-shot pulls 2(N-1)/N x S; Lamport pushes (N-1) x S into every
///    peer, and so does the 2-rank two-shot (`twoshot_polled`: scatter and gather are pushes,
///    kernels/twoshot.cu), and the fused two-shot at every rank count (kernels/twoshot_norm.cu).
///    On a 16-GPU RTX PRO 6000 fabric peer reads ran at ~52 GB/s and peer writes at 2.6
///    (b12x#139, hence b12x pulls in every phase). So the 2-rank two-shot and the fused two-shot
///    are never chosen (the split path's plain 4+ rank two-shot pulls), and AUTO's fallback
///    never moves to a family that pushes ([`Family::writes_into_peers`]).
/// 2. Lamport only while the message is latency-bound: (N-1) x S <= 16 KiB of pushes per rank,
///    i.e. 16 KiB at 2 ranks, 4 KiB at 4, 2 KiB at 6 and 8, 1 KiB at 16. There the bytes take
///    <= 0.7 us at 25 GB/s, below one hop, and Lamport saves the one-shot's flag round trip
///    (2-4 us); on the slow-write fabric above, 16 KiB of writes take 6.3 us, so the worst case
///    loses about one round trip, not tens of us. (A decode step's 1 x 4096-8192 bf16 row, 8-16
///    KiB, stays on Lamport at 2 ranks.)
/// 3. One-shot to the two-shot crossover, then the two-shot, then NCCL above 1 MiB. The one-shot
///    pulls (N-1)(N-2)/N x S more than the two-shot, which pays one more round trip (~3 us): at
///    25 GB/s they cross at ~50 KB at 4 ranks, ~14 KB at 8, ~6 KB at 16 (64, 16, 8 KiB taken;
///    vLLM's NVLink crossovers, 512 and 256 KB at ~360 GB/s, scale to ~35 and ~18 KB). The pulling
///    two-shot moves the ring's bytes, so its gain over NCCL is fixed cost (~15-35 us); at 1 MiB
///    the transfer itself takes 31-63 us at 4 ranks (Gen5 to Gen4), and above it the gain is
///    smaller than what the model leaves out: all-to-all reads from N ranks share root ports
///    and the CPU link where a ring's neighbour-to-neighbour traffic does not, and a kernel's
///    sustained peer-read rate is unmeasured here. At 2 ranks the one-shot moves the ring's
///    bytes (S) too; the same 1 MiB bound keeps it where its latency gain is most of the time.
///    (Where NCCL itself is slow, e.g. without P2P, 344 us at 64 KB in sglang#32479, a tuned
///    file moves these bounds up.)
pub const PCIE_AUTO_TABLE: RankTable<Option<Family>> = &[
    (
        2,
        &[(16 << 10, Some(Family::Lamport)), (1 << 20, Some(Family::OneShot)), (u64::MAX, None)],
    ),
    (
        4,
        &[(4 << 10, Some(Family::Lamport)), (64 << 10, Some(Family::OneShot)), (1 << 20, Some(Family::TwoShot)), (u64::MAX, None)],
    ),
    (
        8,
        &[(2 << 10, Some(Family::Lamport)), (16 << 10, Some(Family::OneShot)), (1 << 20, Some(Family::TwoShot)), (u64::MAX, None)],
    ),
    (
        16,
        &[(1 << 10, Some(Family::Lamport)), (8 << 10, Some(Family::OneShot)), (1 << 20, Some(Family::TwoShot)), (u64::MAX, None)],
    ),
];

/// AUTO's fused table over PCIe, from [`PCIE_AUTO_TABLE`]'s model: the fused Lamport (it pushes)
/// within the same bounds, the fused one-shot (it pulls) to the same crossover, then at 4+ ranks
/// the split path with the plain two-shot (which pulls, where the fused two-shot pushes), NCCL
/// and the norm kernel above 1 MiB. Rows of every width alike (nothing measured says otherwise).
pub const PCIE_FUSED_AUTO_TABLE: RankTable<FusedChoice> = &[
    (
        2,
        &[
            (16 << 10, FusedChoice::Fused(Family::Lamport)),
            (1 << 20, FusedChoice::Fused(Family::OneShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        4,
        &[
            (4 << 10, FusedChoice::Fused(Family::Lamport)),
            (64 << 10, FusedChoice::Fused(Family::OneShot)),
            (1 << 20, FusedChoice::Split(Family::TwoShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        8,
        &[
            (2 << 10, FusedChoice::Fused(Family::Lamport)),
            (16 << 10, FusedChoice::Fused(Family::OneShot)),
            (1 << 20, FusedChoice::Split(Family::TwoShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
    (
        16,
        &[
            (1 << 10, FusedChoice::Fused(Family::Lamport)),
            (8 << 10, FusedChoice::Fused(Family::OneShot)),
            (1 << 20, FusedChoice::Split(Family::TwoShot)),
            (u64::MAX, FusedChoice::Nccl),
        ],
    ),
];

/// AUTO's tables for one link class: plain all-reduce, fused op, fused op with rows wider than
/// [`NARROW_ROW`].
#[derive(Clone, Copy, Debug)]
pub struct AutoTables {
    pub plain: RankTable<Option<Family>>,
    pub fused: RankTable<FusedChoice>,
    pub fused_wide: RankTable<FusedChoice>,
}

/// Ranks on GPUs joined by NVLink: measured on 2 x H200 (one fused table for every width).
pub const NVLINK_TABLES: AutoTables = AutoTables { plain: AUTO_TABLE, fused: FUSED_AUTO_TABLE, fused_wide: FUSED_AUTO_TABLE };
/// Ranks over PCIe: the model of [`PCIE_AUTO_TABLE`].
pub const PCIE_TABLES: AutoTables = AutoTables { plain: PCIE_AUTO_TABLE, fused: PCIE_FUSED_AUTO_TABLE, fused_wide: PCIE_FUSED_AUTO_TABLE };
/// Every rank on one device: measured on one H200 with simulated ranks.
pub const SAME_DEVICE_TABLES: AutoTables =
    AutoTables { plain: ONE_DEVICE_AUTO_TABLE, fused: ONE_DEVICE_FUSED_AUTO_TABLE, fused_wide: ONE_DEVICE_FUSED_AUTO_TABLE_WIDE };

/// The built-in tables of a link class; None where there are none (no peer access: NCCL).
pub fn builtin_tables(class: LinkClass) -> Option<&'static AutoTables> {
    match class {
        LinkClass::SameDevice => Some(&SAME_DEVICE_TABLES),
        LinkClass::NvLink => Some(&NVLINK_TABLES),
        LinkClass::Pcie => Some(&PCIE_TABLES),
        LinkClass::NoPeer => None,
    }
}

/// FNV-1a of every built-in table as the build spells them (each class's, in
/// [`LinkClass::ALL`] order): two builds that choose differently for a size never pair their
/// kernels (`crate::group::exchange`).
pub fn builtin_fingerprint() -> u64 {
    crate::launch::tuning::fnv1a(builtin_text().as_bytes())
}

/// Every built-in table, spelled out (what [`builtin_fingerprint`] hashes).
fn builtin_text() -> String {
    let tables: Vec<_> = LinkClass::ALL.into_iter().map(|c| (c, builtin_tables(c).copied())).collect();
    format!("{tables:?}")
}

fn row_of<T: Copy>(table: RankTable<T>, nranks: i32, bytes: u64) -> Option<T> {
    let row = table.iter().find(|(n, _)| nranks <= *n).unwrap_or(&table[table.len() - 1]).1;
    row.iter().find(|(b, _)| bytes <= *b).map(|(_, c)| *c)
}

/// AUTO's choice for a call, as a fused choice (a plain all-reduce is never split): from
/// `tuned` when it was measured on links of `class` and covers the call, else from the built-in
/// tables of `class`.
fn auto_choice(nranks: i32, dtype: DataType, message: &Message, class: LinkClass, tuned: Option<&Tuning>) -> FusedChoice {
    if let Some(choice) = tuned.and_then(|t| t.choice(class, nranks, dtype, message)) {
        return choice;
    }
    let Some(tables) = builtin_tables(class) else { return FusedChoice::Nccl };
    if message.rows.is_some() {
        let wide = message.rows.is_some_and(|(_, hidden)| hidden > NARROW_ROW);
        let table = if wide { tables.fused_wide } else { tables.fused };
        row_of(table, nranks, message.bytes).unwrap_or(FusedChoice::Nccl)
    } else {
        match row_of(tables.plain, nranks, message.bytes).flatten() {
            Some(f) => FusedChoice::Fused(f),
            None => FusedChoice::Nccl,
        }
    }
}

/// One all-reduce call as every rank sees it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub tp_size: i32,
    pub dtype: DataType,
    /// Bytes of the reduced tensor, and for the fused op its `(tokens, hidden)`.
    pub message: Message,
    /// Input and output 16-byte aligned (the kernels' requirement).
    pub aligned: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `tp_size <= 1`: no peers, the output is a copy of the input (Edge-LLM's passthrough).
    Copy,
    /// The registered `ncclAllReduce`.
    Nccl,
    Custom(Family),
    /// The fused op as the family's plain all-reduce, then the residual + RMSNorm kernel.
    Split(Family),
}

/// Why a custom family did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// No group: ranks not all in this process, no peer access, or not registered yet.
    NoWorkspace,
    /// The group has a different rank count than the plugin's tp_size.
    RankMismatch,
    Unaligned,
    /// Over the workspace, or no kernel for this dtype and rank count.
    NotServed,
    /// Another stream than the one that runs this rank's custom all-reduces (one stream per
    /// group: `Group::claim_stream`).
    OtherStream,
}

impl Fallback {
    pub fn describe(self) -> &'static str {
        match self {
            Fallback::NoWorkspace => "no custom workspace for this device (ranks not all registered in this process, or no peer access)",
            Fallback::RankMismatch => "the plugin's tp_size differs from the registered communicator's rank count",
            Fallback::Unaligned => "input or output is not 16-byte aligned",
            Fallback::NotServed => "the message is larger than the workspace, or no kernel exists for this type and rank count",
            Fallback::OtherStream => "another stream than the one that runs this rank's custom all-reduces (one stream per group: release and set up the workspaces again to move it)",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub path: Path,
    /// Set when the requested path could not run.
    pub fallback: Option<Fallback>,
    pub requested: Requested,
}

/// The path of `call` on a device whose group (if any) is `group`; AUTO with the tuning file's
/// tables where one is loaded ([`crate::launch::tuning::active`]).
pub fn choose(requested: Requested, call: &Call, group: Option<&dyn Fits>) -> Decision {
    choose_tuned(requested, call, group, crate::launch::tuning::active())
}

/// [`choose`] with `tuned` as the tuning file (None: the built-in tables).
pub(crate) fn choose_tuned(requested: Requested, call: &Call, group: Option<&dyn Fits>, tuned: Option<&Tuning>) -> Decision {
    let decide = |path, fallback| Decision { path, fallback, requested };
    if call.tp_size <= 1 {
        return decide(Path::Copy, None);
    }
    let families: &[Family] = match requested {
        Requested::Nccl => return decide(Path::Nccl, None),
        Requested::OneShot => &[Family::OneShot],
        Requested::TwoShot => &[Family::TwoShot],
        Requested::Lamport => &[Family::Lamport],
        Requested::Auto => &[Family::Lamport, Family::OneShot, Family::TwoShot],
    };
    let Some(group) = group else { return decide(Path::Nccl, Some(Fallback::NoWorkspace)) };
    let class = group.link_class();
    if class == LinkClass::NoPeer {
        return decide(Path::Nccl, Some(Fallback::NoWorkspace));
    }
    if group.nranks() != call.tp_size {
        return decide(Path::Nccl, Some(Fallback::RankMismatch));
    }
    if !call.aligned {
        return decide(Path::Nccl, Some(Fallback::Unaligned));
    }
    // The families to try, smallest first from the one asked for, and how they run.
    let (first, split) = match requested {
        Requested::Auto => match auto_choice(group.nranks(), call.dtype, &call.message, class, tuned) {
            FusedChoice::Nccl => return decide(Path::Nccl, None),
            FusedChoice::Fused(f) => (f, false),
            FusedChoice::Split(f) => (f, true),
        },
        _ => (families[0], false),
    };
    let plain = Message { rows: None, ..call.message };
    let message = if split { &plain } else { &call.message };
    let op = if message.rows.is_some() { Op::ResidualRmsNorm } else { Op::AllReduce };
    // AUTO's fallback over PCIe never moves to a family that writes into its peers (the PCIe
    // model, PCIE_AUTO_TABLE): only the table's own choice may.
    let allowed = |f: Family| f == first || requested != Requested::Auto || class != LinkClass::Pcie || !f.writes_into_peers(op, group.nranks());
    let start = families.iter().position(|f| *f == first).unwrap_or(0);
    let served = families[start..].iter().find(|f| allowed(**f) && group.serves(**f, call.dtype, message));
    match served {
        Some(f) if split => decide(Path::Split(*f), None),
        Some(f) => decide(Path::Custom(*f), None),
        None if requested == Requested::Auto => decide(Path::Nccl, None),
        None => decide(Path::Nccl, Some(Fallback::NotServed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        nranks: i32,
        max_bytes: u64,
    }
    impl Fits for Fake {
        fn nranks(&self) -> i32 {
            self.nranks
        }
        fn serves(&self, family: Family, _: DataType, m: &Message) -> bool {
            m.bytes <= if family == Family::Lamport { self.max_bytes.min(2 << 20) } else { self.max_bytes }
        }
    }
    fn call(tp: i32, bytes: u64) -> Call {
        Call { tp_size: tp, dtype: DataType::Bf16, message: Message { bytes, rows: None }, aligned: true }
    }
    const GROUP2: Fake = Fake { nranks: 2, max_bytes: 16_000_000 };
    const GROUP8: Fake = Fake { nranks: 8, max_bytes: 8_000_000 };

    #[test]
    fn one_rank_copies_whatever_is_requested() {
        for r in [Requested::Nccl, Requested::OneShot, Requested::Auto] {
            assert_eq!(choose(r, &call(1, 1024), None).path, Path::Copy);
        }
    }

    #[test]
    fn auto_follows_the_table_then_nccl_above_the_workspace() {
        let at = |g: &Fake, b| choose(Requested::Auto, &call(g.nranks, b), Some(g)).path;
        assert_eq!(at(&GROUP2, 8 << 10), Path::Custom(Family::Lamport));
        assert_eq!(at(&GROUP2, 1 << 20), Path::Custom(Family::Lamport));
        assert_eq!(at(&GROUP2, (2 << 20) + 16), Path::Custom(Family::TwoShot));
        assert_eq!(at(&GROUP2, 8 << 20), Path::Custom(Family::TwoShot));
        assert_eq!(at(&GROUP2, 15 << 20), Path::Custom(Family::TwoShot));
        assert_eq!(at(&GROUP2, 64 << 20), Path::Nccl, "over the workspace");
        let huge = Fake { nranks: 2, max_bytes: 1 << 30 };
        assert_eq!(at(&huge, 32 << 20), Path::Custom(Family::TwoShot), "a large workspace keeps two-shot to 64 MiB");
        assert_eq!(at(&huge, 128 << 20), Path::Nccl, "NCCL above 64 MiB even when the workspace holds it");
        assert_eq!(at(&GROUP8, 32 << 10), Path::Custom(Family::Lamport));
        assert_eq!(at(&GROUP8, 128 << 10), Path::Custom(Family::OneShot));
        assert_eq!(at(&GROUP8, 4 << 20), Path::Custom(Family::TwoShot));
        let d = choose(Requested::Auto, &call(2, 128 << 20), Some(&Fake { nranks: 2, max_bytes: 1 << 30 }));
        assert_eq!((d.path, d.fallback), (Path::Nccl, None));
        let d = choose(Requested::Auto, &call(2, 64 << 20), Some(&GROUP2));
        assert_eq!(d.fallback, None, "NCCL above the workspace is AUTO's choice, not a fallback");
    }

    /// A group over links of a given class.
    struct On<F: Fits>(F, LinkClass);
    impl<F: Fits> Fits for On<F> {
        fn nranks(&self) -> i32 {
            self.0.nranks()
        }
        fn serves(&self, family: Family, dtype: DataType, m: &Message) -> bool {
            self.0.serves(family, dtype, m)
        }
        fn link_class(&self) -> LinkClass {
            self.1
        }
    }
    /// The same group with every rank on one device (simulated ranks).
    #[allow(non_snake_case)]
    fn OneDevice(g: Fake) -> On<Fake> {
        On(g, LinkClass::SameDevice)
    }

    #[test]
    fn ranks_on_one_device_follow_the_table_measured_there() {
        let at = |n: i32, bytes: u64, one: bool| {
            let g = Fake { nranks: n, max_bytes: 64 << 20 };
            let c = call(n, bytes);
            if one { choose(Requested::Auto, &c, Some(&OneDevice(g))).path } else { choose(Requested::Auto, &c, Some(&g)).path }
        };
        let custom = Path::Custom;
        assert_eq!(at(2, 1 << 20, true), custom(Family::Lamport));
        assert_eq!(at(2, 4 << 20, true), custom(Family::OneShot));
        assert_eq!(at(2, 4 << 20, false), custom(Family::TwoShot), "separate GPUs: the links favour the two-shot");
        assert_eq!(at(4, 128 << 10, true), custom(Family::Lamport));
        assert_eq!(at(4, 256 << 10, true), custom(Family::OneShot), "in place, the one-shot from 256 KiB");
        assert_eq!(at(4, 8 << 20, true), custom(Family::OneShot));
        assert_eq!(at(4, 64 << 20, true), custom(Family::OneShot), "in place, the one-shot copies nothing");
        assert_eq!(at(4, 1 << 20, false), custom(Family::TwoShot));
        assert_eq!(at(4, 512 << 10, false), custom(Family::OneShot));
        assert_eq!(at(8, 64 << 10, true), custom(Family::Lamport));
        assert_eq!(at(8, 512 << 10, true), custom(Family::OneShot));
        assert_eq!(at(8, 1 << 20, true), custom(Family::TwoShot));
        assert_eq!(at(8, 64 << 20, true), custom(Family::TwoShot));
        assert_eq!(at(8, 64 << 20, false), Path::Nccl);
        let fused = |n: i32, tokens: u64, hidden: u32, one: bool| {
            let message = Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) };
            let c = Call { tp_size: n, dtype: DataType::Bf16, message, aligned: true };
            let g = Fake { nranks: n, max_bytes: 64 << 20 };
            if one { choose(Requested::Auto, &c, Some(&OneDevice(g))).path } else { choose(Requested::Auto, &c, Some(&g)).path }
        };
        // Rows of 4096 stay fused; wider rows split where the plain one-shot (in place) wins.
        assert_eq!(fused(4, 1024, 4096, true), custom(Family::OneShot));
        assert_eq!(fused(4, 512, 8192, true), Path::Split(Family::OneShot));
        assert_eq!(fused(4, 16, 8192, true), custom(Family::Lamport));
        assert_eq!(fused(8, 8, 4096, true), custom(Family::Lamport));
        assert_eq!(fused(8, 1, 8192, true), Path::Split(Family::Lamport));
        assert_eq!(fused(8, 128, 8192, true), Path::Split(Family::TwoShot));
        assert_eq!(fused(2, 128, 8192, true), custom(Family::OneShot));
        assert_eq!(fused(4, 512, 8192, false), Path::Split(Family::TwoShot), "separate GPUs: their own table");
    }

    #[test]
    fn fused_calls_use_the_fused_table() {
        let fused = |tp, tokens: u64, hidden: u32| Call {
            tp_size: tp,
            dtype: DataType::Bf16,
            message: Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) },
            aligned: true,
        };
        assert_eq!(choose(Requested::Auto, &fused(2, 1, 4096), Some(&GROUP2)).path, Path::Custom(Family::Lamport));
        assert_eq!(choose(Requested::Auto, &fused(2, 8, 8192), Some(&GROUP2)).path, Path::Custom(Family::Lamport));
        assert_eq!(choose(Requested::Auto, &fused(2, 128, 8192), Some(&GROUP2)).path, Path::Custom(Family::Lamport), "2 MiB");
        assert_eq!(choose(Requested::Auto, &fused(2, 256, 8192), Some(&GROUP2)).path, Path::Custom(Family::OneShot));
        assert_eq!(choose(Requested::Auto, &fused(2, 1024, 4096), Some(&GROUP2)).path, Path::Custom(Family::OneShot));
        assert_eq!(choose(Requested::OneShot, &fused(2, 128, 8192), Some(&GROUP2)).path, Path::Custom(Family::OneShot), "forced: fused");
        assert_eq!(choose(Requested::Auto, &fused(8, 1, 4096), Some(&GROUP8)).path, Path::Custom(Family::Lamport));
        assert_eq!(choose(Requested::Auto, &fused(8, 1, 8192), Some(&GROUP8)).path, Path::Custom(Family::OneShot));
        assert_eq!(choose(Requested::Auto, &fused(8, 1024, 8192), Some(&GROUP8)).path, Path::Nccl, "16 MiB");
    }

    #[test]
    fn auto_moves_to_a_larger_family_when_lamport_cannot_serve() {
        let tiny = Fake { nranks: 2, max_bytes: 64 << 10 };
        // The table says Lamport up to 2 MiB; this workspace holds 64 KB: no family can.
        assert_eq!(choose(Requested::Auto, &call(2, 128 << 10), Some(&tiny)).path, Path::Nccl);
        assert_eq!(choose(Requested::Auto, &call(2, 32 << 10), Some(&tiny)).path, Path::Custom(Family::Lamport));
    }

    #[test]
    fn forced_strategies_run_or_fall_back_to_nccl_with_a_reason() {
        assert_eq!(choose(Requested::OneShot, &call(2, 8 << 20), Some(&GROUP2)).path, Path::Custom(Family::OneShot));
        assert_eq!(choose(Requested::TwoShot, &call(2, 1024), Some(&GROUP2)).path, Path::Custom(Family::TwoShot));
        assert_eq!(choose(Requested::Lamport, &call(2, 1024), Some(&GROUP2)).path, Path::Custom(Family::Lamport));
        let cases = [
            (choose(Requested::OneShot, &call(2, 1024), None), Fallback::NoWorkspace),
            (choose(Requested::OneShot, &call(4, 1024), Some(&GROUP2)), Fallback::RankMismatch),
            (choose(Requested::TwoShot, &Call { aligned: false, ..call(2, 1024) }, Some(&GROUP2)), Fallback::Unaligned),
            (choose(Requested::OneShot, &call(2, 32 << 20), Some(&GROUP2)), Fallback::NotServed),
            (choose(Requested::Lamport, &call(2, 4 << 20), Some(&GROUP2)), Fallback::NotServed),
        ];
        for (decision, reason) in cases {
            assert_eq!(decision.path, Path::Nccl);
            assert_eq!(decision.fallback, Some(reason));
        }
        assert_eq!(choose(Requested::Nccl, &call(2, 1024), Some(&GROUP2)).path, Path::Nccl);
    }

    /// A group whose kernels take only `families` (any size).
    struct Only(i32, &'static [Family]);
    impl Fits for Only {
        fn nranks(&self) -> i32 {
            self.0
        }
        fn serves(&self, family: Family, _: DataType, _: &Message) -> bool {
            self.1.contains(&family)
        }
    }

    fn fused_call(tp: i32, tokens: u64, hidden: u32) -> Call {
        Call { tp_size: tp, dtype: DataType::Bf16, message: Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) }, aligned: true }
    }

    #[test]
    fn over_pcie_auto_reads_from_peers_and_leaves_large_messages_to_nccl() {
        // The bounds of PCIE_AUTO_TABLE's model: pushes of (N-1) x S <= 16 KiB per rank, NCCL
        // above 1 MiB.
        let lamport_ok = |n: i32, bytes: u64| (n as u64 - 1) * bytes <= 16 << 10;
        // The table's bound: the largest power of two within it.
        let lamport_bound = |n: i32| 1u64 << (((16u64 << 10) / (n as u64 - 1)).ilog2());
        let mut sizes: Vec<u64> = (4..=28).map(|p| 1u64 << p).collect();
        sizes.extend((4..=28).map(|p| (1u64 << p) + 16));
        for n in crate::launch::family::RANK_COUNTS {
            let g = On(Fake { nranks: n, max_bytes: 64 << 20 }, LinkClass::Pcie);
            for &bytes in &sizes {
                let plain = choose(Requested::Auto, &call(n, bytes), Some(&g)).path;
                match plain {
                    Path::Custom(Family::Lamport) => assert!(lamport_ok(n, bytes), "{n} ranks, {bytes} B: Lamport"),
                    Path::Custom(Family::TwoShot) => assert!(n > 2, "{n} ranks, {bytes} B: the 2-rank two-shot pushes"),
                    Path::Custom(Family::OneShot) => {}
                    Path::Nccl => assert!(bytes > 1 << 20, "{n} ranks, {bytes} B: NCCL"),
                    p => panic!("{p:?}"),
                }
                if bytes > 1 << 20 {
                    assert_eq!(plain, Path::Nccl, "{n} ranks, {bytes} B");
                }
                if bytes <= lamport_bound(n) {
                    assert_eq!(plain, Path::Custom(Family::Lamport), "{n} ranks, {bytes} B: latency-bound");
                }
            }
            for hidden in [2048u32, 4096, 8192] {
                for tokens in (0..=12).map(|p| 1u64 << p) {
                    let c = fused_call(n, tokens, hidden);
                    let bytes = c.message.bytes;
                    match choose(Requested::Auto, &c, Some(&g)).path {
                        Path::Custom(Family::Lamport) | Path::Split(Family::Lamport) => assert!(lamport_ok(n, bytes), "{n} ranks, {tokens}x{hidden}"),
                        Path::Custom(Family::TwoShot) => panic!("{n} ranks, {tokens}x{hidden}: the fused two-shot pushes"),
                        Path::Split(Family::TwoShot) => assert!(n > 2, "{n} ranks, {tokens}x{hidden}"),
                        Path::Nccl => assert!(bytes > 1 << 20, "{n} ranks, {tokens}x{hidden}: NCCL"),
                        _ => assert!(bytes <= 1 << 20),
                    }
                }
            }
        }
        // The model's crossovers.
        let at = |n: i32, bytes: u64| choose(Requested::Auto, &call(n, bytes), Some(&On(Fake { nranks: n, max_bytes: 64 << 20 }, LinkClass::Pcie))).path;
        assert_eq!(at(2, 16 << 10), Path::Custom(Family::Lamport), "one decode row of 8192 bf16");
        assert_eq!(at(2, 32 << 10), Path::Custom(Family::OneShot));
        assert_eq!(at(2, 1 << 20), Path::Custom(Family::OneShot));
        assert_eq!(at(4, 64 << 10), Path::Custom(Family::OneShot));
        assert_eq!(at(4, 128 << 10), Path::Custom(Family::TwoShot), "the pulling two-shot at 4 ranks");
        assert_eq!(at(6, 2 << 10), Path::Custom(Family::Lamport), "6 ranks: the 8-rank row");
        assert_eq!(at(16, 2 << 10), Path::Custom(Family::OneShot));
        assert_eq!(at(8, 2 << 20), Path::Nccl);
    }

    #[test]
    fn over_pcie_the_fallback_never_moves_to_a_family_that_pushes() {
        // The table says one-shot; a group that cannot run it moves on to the two-shot over
        // NVLink, but over PCIe only where the two-shot pulls (4+ ranks, plain).
        let no_oneshot: &[Family] = &[Family::TwoShot, Family::Lamport];
        let path = |n: i32, c: &Call, class| choose(Requested::Auto, c, Some(&On(Only(n, no_oneshot), class))).path;
        assert_eq!(path(2, &call(2, 64 << 10), LinkClass::Pcie), Path::Nccl);
        assert_eq!(path(2, &call(2, 3 << 20), LinkClass::NvLink), Path::Custom(Family::TwoShot), "NVLink: unchanged");
        assert_eq!(path(4, &call(4, 32 << 10), LinkClass::Pcie), Path::Custom(Family::TwoShot), "4 ranks: the two-shot pulls");
        assert_eq!(path(4, &fused_call(4, 4, 4096), LinkClass::Pcie), Path::Nccl, "the fused two-shot pushes");
        assert_eq!(path(4, &fused_call(4, 64, 4096), LinkClass::NvLink), Path::Custom(Family::TwoShot), "NVLink: the fused one-shot's fallback");
        // A forced strategy is the user's to choose.
        assert_eq!(choose(Requested::TwoShot, &call(2, 64 << 10), Some(&On(Only(2, no_oneshot), LinkClass::Pcie))).path, Path::Custom(Family::TwoShot));
        assert_eq!(choose(Requested::Lamport, &call(2, 1 << 20), Some(&On(GROUP2, LinkClass::Pcie))).path, Path::Custom(Family::Lamport));
    }

    #[test]
    fn without_peer_access_every_call_uses_nccl() {
        let g = On(Fake { nranks: 2, max_bytes: 64 << 20 }, LinkClass::NoPeer);
        for r in [Requested::Auto, Requested::OneShot, Requested::TwoShot, Requested::Lamport] {
            for bytes in [1024, 1 << 20, 64 << 20] {
                let d = choose(r, &call(2, bytes), Some(&g));
                assert_eq!((d.path, d.fallback), (Path::Nccl, Some(Fallback::NoWorkspace)), "{r:?} {bytes}");
            }
            assert_eq!(choose(r, &fused_call(2, 1, 4096), Some(&g)).path, Path::Nccl);
        }
        assert!(builtin_tables(LinkClass::NoPeer).is_none());
        assert_eq!(choose(Requested::Nccl, &call(1, 1024), Some(&g)).path, Path::Copy, "one rank still copies");
    }

    #[test]
    fn tuned_tables_serve_the_links_they_were_measured_on() {
        let machine = crate::launch::tuning::Machine { host: "h".into(), driver: "d".into(), gpus: vec![crate::launch::tuning::Gpu { bus_id: "0000:01:00.0".into(), name: "GPU".into() }] };
        let text = |links: &str| {
            format!(
                "edgellm-allreduce tuning v1\nmachine: {}\ndriver: {}\ngpu: 0000:01:00.0 GPU\nlinks: {links}\nlibrary: {}\n\
                 plain ranks=2 dtype=any upto=4096 oneshot\nplain ranks=2 dtype=any upto=max twoshot\n\
                 fused ranks=2 dtype=bf16 rows=any upto=max split:oneshot\nend rows=3\n",
                machine.host,
                machine.driver,
                crate::launch::tuning::library_id()
            )
        };
        let pcie = Tuning::parse(&text("pcie")).unwrap();
        pcie.check(&machine).unwrap();
        let g = |class| On(Fake { nranks: 2, max_bytes: 64 << 20 }, class);
        let auto = |c: &Call, class, t: Option<&Tuning>| choose_tuned(Requested::Auto, c, Some(&g(class)), t).path;
        assert_eq!(auto(&call(2, 1 << 20), LinkClass::Pcie, Some(&pcie)), Path::Custom(Family::TwoShot), "the file's choice, a push family included");
        assert_eq!(auto(&call(2, 4096), LinkClass::Pcie, Some(&pcie)), Path::Custom(Family::OneShot));
        assert_eq!(auto(&call(2, 1 << 20), LinkClass::Pcie, None), Path::Custom(Family::OneShot), "built-in PCIe table");
        assert_eq!(auto(&call(2, 1 << 20), LinkClass::NvLink, Some(&pcie)), Path::Custom(Family::Lamport), "NVLink group: built-in");
        assert_eq!(auto(&fused_call(2, 8, 8192), LinkClass::Pcie, Some(&pcie)), Path::Split(Family::OneShot));
        assert_eq!(
            choose_tuned(Requested::Auto, &Call { dtype: DataType::Half, ..fused_call(2, 8, 8192) }, Some(&g(LinkClass::Pcie)), Some(&pcie)).path,
            Path::Custom(Family::OneShot),
            "fp16 fused: no section, the built-in PCIe table"
        );
        let four = On(Fake { nranks: 4, max_bytes: 64 << 20 }, LinkClass::Pcie);
        assert_eq!(choose_tuned(Requested::Auto, &call(4, 128 << 10), Some(&four), Some(&pcie)).path, Path::Custom(Family::TwoShot), "4 ranks: built-in");
        assert_eq!(choose_tuned(Requested::OneShot, &call(2, 1 << 20), Some(&g(LinkClass::Pcie)), Some(&pcie)).path, Path::Custom(Family::OneShot), "forced: the file is AUTO's");
        let same = Tuning::parse(&text("same-device")).unwrap();
        assert_eq!(auto(&call(2, 1 << 20), LinkClass::SameDevice, Some(&same)), Path::Custom(Family::TwoShot));
        assert_eq!(auto(&call(2, 1 << 20), LinkClass::Pcie, Some(&same)), Path::Custom(Family::OneShot));
    }

    #[test]
    fn the_fingerprint_covers_every_built_in_table() {
        let text = builtin_text();
        for table in [AUTO_TABLE, ONE_DEVICE_AUTO_TABLE, PCIE_AUTO_TABLE] {
            assert!(text.contains(&format!("{table:?}")), "{table:?}");
        }
        for table in [FUSED_AUTO_TABLE, ONE_DEVICE_FUSED_AUTO_TABLE, ONE_DEVICE_FUSED_AUTO_TABLE_WIDE, PCIE_FUSED_AUTO_TABLE] {
            assert!(text.contains(&format!("{table:?}")), "{table:?}");
        }
        assert_eq!(builtin_fingerprint(), crate::launch::tuning::fnv1a(text.as_bytes()));
        // Every built-in table is well formed: increasing bounds, an unbounded last entry, a
        // row for the largest rank count.
        for class in LinkClass::ALL {
            let Some(t) = builtin_tables(class) else { continue };
            let check = |rows: Vec<(i32, Vec<u64>)>| {
                assert!(rows.last().is_some_and(|(n, _)| *n >= 16), "{class:?}");
                for (n, bounds) in rows {
                    assert!(bounds.windows(2).all(|w| w[0] < w[1]) && bounds.last() == Some(&u64::MAX), "{class:?} {n}");
                }
            };
            check(t.plain.iter().map(|(n, r)| (*n, r.iter().map(|e| e.0).collect())).collect());
            check(t.fused.iter().map(|(n, r)| (*n, r.iter().map(|e| e.0).collect())).collect());
            check(t.fused_wide.iter().map(|(n, r)| (*n, r.iter().map(|e| e.0).collect())).collect());
        }
    }
}
