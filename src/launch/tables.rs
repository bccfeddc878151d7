//! AUTO's tables: by link class (`crate::link`), rank count and message size, which family
//! (or NCCL) runs a plain all-reduce and how the fused op runs. Each table says where its
//! bounds come from: a measurement (with its run file) or a stated model. `super::strategy`
//! reads them; a tuning file (`super::tuning`) takes the place of one class's.

use super::family::Family;
use crate::link::LinkClass;

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
    (2, &[(2 << 20, Some(Family::Lamport)), (64 << 20, Some(Family::TwoShot)), (u64::MAX, None)]),
    (
        4,
        &[
            (256 << 10, Some(Family::Lamport)),
            (512 << 10, Some(Family::OneShot)),
            (8 << 20, Some(Family::TwoShot)),
            (u64::MAX, None),
        ],
    ),
    (
        16,
        &[
            (64 << 10, Some(Family::Lamport)),
            (256 << 10, Some(Family::OneShot)),
            (8 << 20, Some(Family::TwoShot)),
            (u64::MAX, None),
        ],
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
    (2, &[(1 << 20, Some(Family::Lamport)), (64 << 20, Some(Family::OneShot)), (u64::MAX, None)]),
    (4, &[(128 << 10, Some(Family::Lamport)), (64 << 20, Some(Family::OneShot)), (u64::MAX, None)]),
    (
        16,
        &[
            (64 << 10, Some(Family::Lamport)),
            (512 << 10, Some(Family::OneShot)),
            (64 << 20, Some(Family::TwoShot)),
            (u64::MAX, None),
        ],
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
pub(crate) const PCIE_AUTO_TABLE: RankTable<Option<Family>> = &[
    (2, &[(16 << 10, Some(Family::Lamport)), (1 << 20, Some(Family::OneShot)), (u64::MAX, None)]),
    (
        4,
        &[
            (4 << 10, Some(Family::Lamport)),
            (64 << 10, Some(Family::OneShot)),
            (1 << 20, Some(Family::TwoShot)),
            (u64::MAX, None),
        ],
    ),
    (
        8,
        &[
            (2 << 10, Some(Family::Lamport)),
            (16 << 10, Some(Family::OneShot)),
            (1 << 20, Some(Family::TwoShot)),
            (u64::MAX, None),
        ],
    ),
    (
        16,
        &[
            (1 << 10, Some(Family::Lamport)),
            (8 << 10, Some(Family::OneShot)),
            (1 << 20, Some(Family::TwoShot)),
            (u64::MAX, None),
        ],
    ),
];

/// AUTO's fused table over PCIe, from [`PCIE_AUTO_TABLE`]'s model: the fused Lamport (it pushes)
/// within the same bounds, the fused one-shot (it pulls) to the same crossover, then at 4+ ranks
/// the split path with the plain two-shot (which pulls, where the fused two-shot pushes), NCCL
/// and the norm kernel above 1 MiB. Rows of every width alike (nothing measured says otherwise).
pub(crate) const PCIE_FUSED_AUTO_TABLE: RankTable<FusedChoice> = &[
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

/// The built-in grid caps: on these links, a family's kernels for groups of up to `n` ranks take
/// at most this many CTAs (a tuning file's `grid` lines take their place). None yet.
pub(crate) const GRID_CAPS: &[(LinkClass, Family, GridCaps)] = &[];

/// `(up to n ranks, at most c CTAs)`, by increasing rank count.
pub(crate) type GridCaps = &'static [(i32, u32)];

/// The built-in cap of `family` on `nranks` ranks over `class` ([`GRID_CAPS`]).
pub(crate) fn builtin_grid_cap(class: LinkClass, family: Family, nranks: i32) -> Option<u32> {
    let (_, _, caps) = GRID_CAPS.iter().find(|(c, f, _)| *c == class && *f == family)?;
    caps.iter().find(|(n, _)| nranks <= *n).map(|&(_, ctas)| ctas)
}

/// AUTO's tables for one link class: plain all-reduce, fused op, fused op with rows wider than
/// [`NARROW_ROW`].
#[derive(Clone, Copy, Debug)]
pub struct AutoTables {
    pub plain: RankTable<Option<Family>>,
    pub fused: RankTable<FusedChoice>,
    pub fused_wide: RankTable<FusedChoice>,
}

/// Ranks on GPUs joined by NVLink: measured on 2 x H200 (one fused table for every width).
pub(crate) const NVLINK_TABLES: AutoTables =
    AutoTables { plain: AUTO_TABLE, fused: FUSED_AUTO_TABLE, fused_wide: FUSED_AUTO_TABLE };
/// Ranks over PCIe: the model of [`PCIE_AUTO_TABLE`].
pub(crate) const PCIE_TABLES: AutoTables =
    AutoTables { plain: PCIE_AUTO_TABLE, fused: PCIE_FUSED_AUTO_TABLE, fused_wide: PCIE_FUSED_AUTO_TABLE };
/// Every rank on one device: measured on one H200 with simulated ranks.
pub(crate) const SAME_DEVICE_TABLES: AutoTables = AutoTables {
    plain: ONE_DEVICE_AUTO_TABLE,
    fused: ONE_DEVICE_FUSED_AUTO_TABLE,
    fused_wide: ONE_DEVICE_FUSED_AUTO_TABLE_WIDE,
};

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
pub(crate) fn builtin_fingerprint() -> u64 {
    crate::fingerprint::fnv1a(builtin_text().as_bytes())
}

/// Every built-in table, spelled out (what [`builtin_fingerprint`] hashes).
pub(crate) fn builtin_text() -> String {
    let tables: Vec<_> = LinkClass::ALL.into_iter().map(|c| (c, builtin_tables(c).copied())).collect();
    format!("{tables:?} {GRID_CAPS:?}")
}
