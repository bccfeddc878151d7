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
/// the links see (N-1)*S and 2(N-1)/N*S. 2 ranks, the one-shot reading inputs in place since
/// issue 42, one H100, bf16, 20 ops per graph, two rounds (docs/runs/2026-12-06-h100-contract-check-n2.txt):
/// Lamport to 512 KiB (4.95 against the one-shot's 5.00 us), the one-shot above (5.22 against
/// 5.58 at 768 KiB, 6.24 against 7.79 at 2 MiB); 4 and 8 ranks with
/// the inputs read in place (docs/runs/2026-12-01-h200-inplace-oneshot.txt): 4 ranks Lamport to
/// 128 KiB (5.95 against the one-shot's 6.21 us), the one-shot above (6.38 against 6.85 at 256
/// KiB, 177 against the two-shot's 198 at 64 MiB); 8 ranks the one-shot to 512 KiB (12.1
/// against 12.9), the two-shot above (14.2 against 15.7 at 1 MiB, 331 against 507 at 64 MiB).
/// 8 ranks' Lamport bound from one H100, two rounds (docs/runs/2026-12-06-h100-tune-quick.txt):
/// Lamport to 48 KiB (9.17 against the one-shot's 9.25 us), not at 64 KiB (9.51 against 9.24);
/// the same run confirms 4 ranks' 128 KiB (6.31 against 6.45; 6.84 against 6.63 at 192 KiB).
pub(crate) const ONE_DEVICE_AUTO_TABLE: RankTable<Option<Family>> = &[
    (2, &[(512 << 10, Some(Family::Lamport)), (64 << 20, Some(Family::OneShot)), (u64::MAX, None)]),
    (4, &[(128 << 10, Some(Family::Lamport)), (64 << 20, Some(Family::OneShot)), (u64::MAX, None)]),
    (
        16,
        &[
            (48 << 10, Some(Family::Lamport)),
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
/// measured between GPUs (no PCIe pair here): written from a model, for
/// `edgellm-allreduce-bench tune` to replace on the machine itself (`crate::launch::tuning`).
///
/// The model. A PCIe x16 link carries ~25 GB/s per direction at Gen4 and ~50 at Gen5 (25 GB/s
/// measured at Gen4, ZaidQureshi/bam#54; on this project's H100 the GPU's own Gen5 x16 link to
/// host memory carried 52.8 GB/s of SM stores and 51.4 of SM loads,
/// `docs/runs/2026-12-06-h100-probe-host.txt`: GPU to host, not GPU to GPU), and a flag handoff
/// costs a hop of ~1-2 us (a GPU-driven PCIe round trip ~2 us, ai-dynamo/aiconfigurator#1301;
/// a load round trip to host memory 1.06 us and a store made visible 0.68 us here). NCCL pays
/// ~20-45 us at small sizes (36 us at TP16, local-inference-lab/b12x#139; 45 us at 4 KB on
/// 8 x RTX 6000D, sgl-project/sglang#32479). Three rules follow.
///
/// 1. Push, never pull. Posted writes are the safe direction: on some platforms peer loads never
///    complete (haohervchb/sglang-V100#2; client CPUs support peer writes only,
///    NVIDIA/open-gpu-kernel-modules#1253), and where both work pushing measured faster (a push
///    one-shot 5.1/6.7/13.5 us at 5/10/32 KiB against 14.6/18.8/27.9 for pull and 16.0/16.6/18.7
///    for NCCL on 4 GPUs, squibloads/vllm-pcie-allreduce; on 4 x RTX PRO 6000 peer stores ran at
///    44.8 GB/s and loads 42.8, vllm-project/vllm#56128). So the one family is the staged push
///    ([`Family::Push`]): at 2 ranks a push one-shot, at N ranks N-1 passes with one outbound and
///    one inbound peer each, since all-to-all peer traffic collapses on a root complex (FlashInfer's
///    PCIe all-reduce stages its pushes likewise, flashinfer-ai/flashinfer#4393). Lamport pushes
///    too, but all-to-all, its payload its own flag: TensorRT-LLM and FlashInfer use it on NVLink
///    only. No pulling family runs over PCIe unless a tuning file or `EDGELLM_ALLREDUCE_STRATEGY`
///    chose one (`crate::launch::strategy::pulls_enabled`).
/// 2. Push while it beats NCCL's fixed cost. It moves (N-1) x S per rank where the ring moves
///    2(N-1)/N x S, and takes N-1 handoffs: it gains 25 - 1.5 (N-1) - (N-1)(N-2)/N x S / 25 GB/s
///    us (NCCL's cost taken at 25 us, a hop at 1.5 us, Gen4): at 2 ranks the bytes are the ring's
///    and it gains the fixed cost at every size (FlashInfer pushes at every size there, and b12x
///    up to 512 KiB, local-inference-lab/b12x#246), up to its 1 MiB rows; at 4 ranks up to ~340
///    KB (256 KiB taken), at 6 and 8 up to ~69 KB (64 KiB); at 16 the 15 handoffs eat the gain
///    (NCCL).
/// 3. A few CTAs ([`GRID_CAPS`]): stores saturated the host link from 2 CTAs here (42 GB/s with
///    one), and FlashInfer's PCIe kernels use 16 CTAs at 2 ranks and 1-4 when staged
///    (`flashinfer/comm/pcie_ipc_policy.py`): 16 and 4.
pub(crate) const PCIE_AUTO_TABLE: RankTable<Option<Family>> = &[
    (2, &[(1 << 20, Some(Family::Push)), (u64::MAX, None)]),
    (4, &[(256 << 10, Some(Family::Push)), (u64::MAX, None)]),
    (8, &[(64 << 10, Some(Family::Push)), (u64::MAX, None)]),
    (16, &[(u64::MAX, None)]),
];

/// AUTO's fused table over PCIe, from [`PCIE_AUTO_TABLE`]'s model: the fused staged push within
/// the same bounds, NCCL and the norm kernel above. Rows of every width alike.
pub(crate) const PCIE_FUSED_AUTO_TABLE: RankTable<FusedChoice> = &[
    (2, &[(1 << 20, FusedChoice::Fused(Family::Push)), (u64::MAX, FusedChoice::Nccl)]),
    (4, &[(256 << 10, FusedChoice::Fused(Family::Push)), (u64::MAX, FusedChoice::Nccl)]),
    (8, &[(64 << 10, FusedChoice::Fused(Family::Push)), (u64::MAX, FusedChoice::Nccl)]),
    (16, &[(u64::MAX, FusedChoice::Nccl)]),
];

/// The built-in grid caps: on these links, a family's kernels for groups of up to `n` ranks take
/// at most this many CTAs (a tuning file's `grid` lines take their place): the staged push over
/// PCIe, 16 at 2 ranks and 4 above ([`PCIE_AUTO_TABLE`]'s rule 3).
pub(crate) const GRID_CAPS: &[(LinkClass, Family, GridCaps)] = &[(LinkClass::Pcie, Family::Push, &[(2, 16), (16, 4)])];

/// `(up to n ranks, at most c CTAs)`, by increasing rank count.
pub(crate) type GridCaps = &'static [(i32, u32)];

/// The built-in cap of `family` on `nranks` ranks over `class` ([`GRID_CAPS`]); None: the
/// group's own. Public for `edgellm-allreduce-bench tune`, which writes a grid line only where it
/// measured another cap.
pub fn builtin_grid_cap(class: LinkClass, family: Family, nranks: i32) -> Option<u32> {
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
