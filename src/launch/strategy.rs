//! Which path runs an all-reduce: a copy (one rank), NCCL, or a custom kernel family.
//!
//! Every rank of a communicator must take the same path for the same call, so the choice is a
//! pure function of what all ranks share: the plugin's fields (or the environment override),
//! the message size, the group's rank count, workspace and devices (separate GPUs, or all on
//! one), and the tensor alignment (TensorRT lays out the same engine identically on every rank).
//!
//! AUTO picks from [`AUTO_TABLE`] (ranks on separate GPUs) or [`ONE_DEVICE_AUTO_TABLE`] (all on
//! one device: simulated ranks, where memory instead of the links carries the bytes), by rank
//! count and message size; a family that cannot serve a call (message over its workspace,
//! unaligned tensors, no group) falls back to the next larger family, then to NCCL. A forced
//! strategy that cannot run falls back to NCCL.

pub use crate::config::Requested;
use crate::launch::family::Family;
use crate::launch::{Fits, Message};
use crate::tensor::DataType;

/// Rows (first whose rank bound is >= the group's ranks) of entries (first whose byte bound is
/// >= the message's bytes).
pub(crate) type RankTable<T> = &'static [(i32, &'static [(u64, T)])];

/// AUTO's choice by rank count (first row whose bound is >= the group's ranks) and message size
/// (first entry whose bound is >= the bytes); `None` is NCCL. For ranks on separate GPUs;
/// [`ONE_DEVICE_AUTO_TABLE`] when all share one device.
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

/// AUTO's table when every rank is on one device ([`Fits::one_device`]: simulated ranks). There
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
pub(crate) enum FusedChoice {
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
pub(crate) const NARROW_ROW: u32 = 4096;

fn row_of<T: Copy>(table: RankTable<T>, nranks: i32, bytes: u64) -> Option<T> {
    let row = table.iter().find(|(n, _)| nranks <= *n).unwrap_or(&table[table.len() - 1]).1;
    row.iter().find(|(b, _)| bytes <= *b).map(|(_, c)| *c)
}

/// AUTO's choice for a call, as a fused choice (a plain all-reduce is never split); `one_device`:
/// every rank on one device (the tables measured so).
fn auto_choice(nranks: i32, message: &Message, one_device: bool) -> FusedChoice {
    if message.rows.is_some() {
        let wide = message.rows.is_some_and(|(_, hidden)| hidden > NARROW_ROW);
        let table = match (one_device, wide) {
            (false, _) => FUSED_AUTO_TABLE,
            (true, false) => ONE_DEVICE_FUSED_AUTO_TABLE,
            (true, true) => ONE_DEVICE_FUSED_AUTO_TABLE_WIDE,
        };
        row_of(table, nranks, message.bytes).unwrap_or(FusedChoice::Nccl)
    } else {
        let table = if one_device { ONE_DEVICE_AUTO_TABLE } else { AUTO_TABLE };
        match row_of(table, nranks, message.bytes).flatten() {
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

/// The path of `call` on a device whose group (if any) is `group`.
pub fn choose(requested: Requested, call: &Call, group: Option<&dyn Fits>) -> Decision {
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
    if group.nranks() != call.tp_size {
        return decide(Path::Nccl, Some(Fallback::RankMismatch));
    }
    if !call.aligned {
        return decide(Path::Nccl, Some(Fallback::Unaligned));
    }
    // The families to try, smallest first from the one asked for, and how they run.
    let (first, split) = match (requested, auto_choice(group.nranks(), &call.message, group.one_device())) {
        (Requested::Auto, FusedChoice::Nccl) => return decide(Path::Nccl, None),
        (Requested::Auto, FusedChoice::Fused(f)) => (f, false),
        (Requested::Auto, FusedChoice::Split(f)) => (f, true),
        _ => (families[0], false),
    };
    let plain = Message { rows: None, ..call.message };
    let start = families.iter().position(|f| *f == first).unwrap_or(0);
    let served = families[start..].iter().find(|f| group.serves(**f, call.dtype, if split { &plain } else { &call.message }));
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

    /// The same group with every rank on one device (simulated ranks).
    struct OneDevice(Fake);
    impl Fits for OneDevice {
        fn nranks(&self) -> i32 {
            self.0.nranks
        }
        fn serves(&self, family: Family, dtype: DataType, m: &Message) -> bool {
            self.0.serves(family, dtype, m)
        }
        fn one_device(&self) -> bool {
            true
        }
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
}
