//! The kernel families, each described once ([`Family::describe`]): its name (in settings,
//! tuning files and logs), its id, its kernels and how they move data, its launch rules, and the
//! files that define its kernels. Everything else derives from the description: the strategies a
//! user may ask for (`crate::launch::strategy::Requested`), the tuning file's words, the exchange
//! record's code, the kernels the loader asks for, and `kernels/ear_families.h` (ids, kernel
//! stems, rules, sources), from which the kernel simulations build their tables (a test below
//! checks it is fresh). The rules are kinds the C side knows (`crate::contract::EarRule`):
//! `ear_plan_of` in `kernels/allreduce_params.h`, called through `kernels/layout.c`, switches on
//! them and never on a family.
//!
//! Adding a family: its kernel file, its variant and description here (then
//! `EDGELLM_WRITE_GENERATED=1 cargo test` rewrites `kernels/ear_families.h`), its line in
//! docs/KERNELS.md; docs/DESIGN.md ("Adding a family") says why nothing else changes.

use crate::contract::{EarCapacityRule, EarFlagsRule, EarFusedFitRule, EarFusedGridRule, EarGridRule, EarRule};
use crate::tensor::DataType;

/// Rank counts the kernels are instantiated for (`EAR_FOR_EACH_RANK_COUNT`: a test checks).
pub const RANK_COUNTS: [i32; 5] = [2, 4, 6, 8, 16];

/// Element types the kernels are instantiated for (`EAR_FOR_EACH_TYPE` in `kernels/common.cuh`).
pub(crate) const TYPES: [DataType; 3] = [DataType::Float, DataType::Half, DataType::Bf16];

/// A kernel family: how the reduction moves data between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Every rank stages its input, one barrier, every rank reads all peers and reduces.
    OneShot,
    /// Reduce-scatter, then all-gather: 2(N-1)/N of the data over the links. 2 ranks: pushed
    /// through a polled (Lamport) stage and gather (above 8 MiB paced by per-chunk flags,
    /// pipelined); 4 and more: a local copy (none when the peers read the input in place), then
    /// pulled between two flag barriers.
    TwoShot,
    /// Push one-shot whose payload is its own arrival flag: no barrier (small messages).
    Lamport,
    /// Staged push for PCIe: N-1 passes, in each a rank stores into one peer and is stored into
    /// by one peer, a flag handoff between passes; then every peer's data is local (at 2 ranks a
    /// push one-shot). Never a peer load.
    Push,
}

/// What a kernel computes after the reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// The sum, and nothing else.
    AllReduce,
    /// `residual_out = sum + bias + residual`, `normed = RMSNorm(residual_out) * gamma`.
    ResidualRmsNorm,
}

/// How a kernel moves its data between ranks: over PCIe, peer writes are posted and reads are
/// not, and some platforms complete only the writes (`crate::launch::tables`' PCIe model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Stores into its peers' memory, polls only its own.
    Push,
    /// Loads from its peers' memory.
    Pull,
}

/// One family, described once.
#[derive(Debug)]
pub(crate) struct Description {
    /// Its name in settings (`EDGELLM_ALLREDUCE_STRATEGY`, case-insensitive), tuning files and logs.
    pub name: &'static str,
    /// `EarPlan::family`, also its code in the exchange record; `EAR_FAMILY_<NAME>` in
    /// `kernels/ear_families.h`. Ids run from 0 with no gap but `EAR_FAMILY_NORM`, which no family
    /// takes (the simulations index their tables by id).
    pub id: i32,
    /// Stems of its plain kernels at 2 ranks and at 4 and more (`ear_<stem>_<t>_n<N>`).
    pub plain: [&'static str; 2],
    /// Stem of its fused all-reduce + residual + RMSNorm kernel.
    pub fused: &'static str,
    /// How the plain kernels at 2 ranks, at 4 and more, and the fused kernel move data.
    pub transport: [Transport; 3],
    /// Its launch rules, as `ear_plan_of` and the fit checks read them.
    pub rule: EarRule,
    /// The files of `kernels/` that define its kernels (the simulations include them, through
    /// `kernels/ear_families.h`, which the tests write).
    #[cfg_attr(not(test), allow(dead_code))]
    pub sources: &'static [&'static str],
}

const ONESHOT: Description = Description {
    name: "oneshot",
    id: 0,
    // Stage, one flag barrier, pull (oneshot.cu); the fused: one barrier (oneshot_norm.cu).
    plain: ["oneshot_barrier", "oneshot_barrier"],
    fused: "oneshot_barrier_norm",
    transport: [Transport::Pull, Transport::Pull, Transport::Pull],
    rule: EarRule {
        grid: EarGridRule::Vecs,
        fused_grid: EarFusedGridRule::Rows,
        capacity: EarCapacityRule::Workspace,
        fused_fit: EarFusedFitRule::Oneshot,
        flags: EarFlagsRule::PointersOutOfPlace,
    },
    sources: &["oneshot", "oneshot_norm"],
};

const TWOSHOT: Description = Description {
    name: "twoshot",
    id: 1,
    // 2 ranks: data polled like Lamport's, above 8 MiB paced by per-chunk flags (twoshot.cu);
    // 4 and more: a local copy (or the input read in place), pulled between two flag barriers
    // (twoshot_wide.cu); the fused: pushed slices between two barriers (twoshot_norm.cu).
    plain: ["twoshot_polled", "twoshot_barrier"],
    fused: "twoshot_barrier_norm",
    transport: [Transport::Push, Transport::Pull, Transport::Push],
    rule: EarRule {
        grid: EarGridRule::Segments,
        fused_grid: EarFusedGridRule::Rows,
        capacity: EarCapacityRule::Workspace,
        fused_fit: EarFusedFitRule::Twoshot,
        flags: EarFlagsRule::PointersAlways,
    },
    sources: &["twoshot", "twoshot_wide", "twoshot_norm"],
};

const LAMPORT: Description = Description {
    name: "lamport",
    id: 2,
    // Push, the payload its own flag: no barrier (lamport.cu, lamport_norm.cu).
    plain: ["oneshot_lamport", "oneshot_lamport"],
    fused: "oneshot_lamport_norm",
    transport: [Transport::Push, Transport::Push, Transport::Push],
    rule: EarRule {
        grid: EarGridRule::Lamport,
        fused_grid: EarFusedGridRule::Lamport,
        capacity: EarCapacityRule::Lamport,
        fused_fit: EarFusedFitRule::Lamport,
        flags: EarFlagsRule::None,
    },
    sources: &["lamport", "lamport_norm"],
};

const PUSH: Description = Description {
    name: "push",
    id: 4, // after EAR_FAMILY_NORM's 3
    // N-1 passes of remote stores and flag handoffs, then a local reduce (push.cu, push_norm.cu).
    plain: ["push_staged", "push_staged"],
    fused: "push_staged_norm",
    transport: [Transport::Push, Transport::Push, Transport::Push],
    rule: EarRule {
        grid: EarGridRule::Vecs,
        fused_grid: EarFusedGridRule::Rows,
        capacity: EarCapacityRule::Push,
        fused_fit: EarFusedFitRule::Push,
        flags: EarFlagsRule::None,
    },
    sources: &["push", "push_norm"],
};

impl Family {
    pub const ALL: [Family; 4] = [Family::OneShot, Family::TwoShot, Family::Lamport, Family::Push];

    /// The family's description (a new variant without one does not compile).
    pub(crate) const fn describe(self) -> &'static Description {
        match self {
            Family::OneShot => &ONESHOT,
            Family::TwoShot => &TWOSHOT,
            Family::Lamport => &LAMPORT,
            Family::Push => &PUSH,
        }
    }

    /// Its name in settings, tuning files and logs ("oneshot").
    pub fn name(self) -> &'static str {
        self.describe().name
    }

    /// The family named `name`, in any case.
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name().eq_ignore_ascii_case(name.trim()))
    }

    /// The family's id in the kernels' contract (`EarPlan::family`).
    pub(crate) fn id(self) -> i32 {
        self.describe().id
    }

    /// The family with contract id `id`.
    pub(crate) fn from_id(id: i32) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.id() == id)
    }

    /// The stem of the family's kernel names for `op` among `nranks` ranks.
    pub(crate) fn stem(self, op: Op, nranks: i32) -> &'static str {
        let d = self.describe();
        match op {
            Op::AllReduce => d.plain[(nranks > 2) as usize],
            Op::ResidualRmsNorm => d.fused,
        }
    }

    /// How the family's kernel for `op` among `nranks` moves its data.
    pub fn transport(self, op: Op, nranks: i32) -> Transport {
        let t = self.describe().transport;
        match op {
            Op::AllReduce => t[(nranks > 2) as usize],
            Op::ResidualRmsNorm => t[2],
        }
    }

    /// Whether the family's kernel for `op` among `nranks` writes into its peers' memory.
    pub fn writes_into_peers(self, op: Op, nranks: i32) -> bool {
        self.transport(op, nranks) == Transport::Push
    }

    /// Largest plain message of this family in a workspace of `max_msg_bytes`.
    pub fn max_bytes(self, max_msg_bytes: u64) -> u64 {
        // SAFETY: pure arithmetic on the header's macros.
        unsafe { ear_max_msg(self.describe().rule.capacity, max_msg_bytes) }
    }

    /// Whether a plain message of `bytes` fits the family's part of the workspace.
    pub(crate) fn fits(self, bytes: u64, max_msg_bytes: u64) -> bool {
        bytes <= self.max_bytes(max_msg_bytes)
    }

    /// Whether `tokens` rows of `hidden` elements of `elem` bytes fit the family's fused kernel.
    pub(crate) fn fused_fits(self, tokens: u64, hidden: u32, elem: usize, max_msg_bytes: u64, nranks: i32) -> bool {
        let rule = self.describe().rule.fused_fit;
        // SAFETY: pure arithmetic on the header's macros.
        unsafe { ear_fused_fits(rule, tokens, hidden, elem as u32, max_msg_bytes, nranks) != 0 }
    }
}

/// `ear_<stem>_<t>_n<N>`: the name of a family's kernel.
pub(crate) fn kernel_name(family: Family, op: Op, dtype: DataType, nranks: i32) -> String {
    format!("ear_{}_{}_n{nranks}", family.stem(op, nranks), type_suffix(dtype))
}

/// `ear_residual_rmsnorm_<t>`: residual + bias + RMSNorm alone (after NCCL, or one rank). It
/// synchronises with nothing.
pub(crate) fn norm_kernel_name(dtype: DataType) -> String {
    format!("ear_residual_rmsnorm_{}", type_suffix(dtype))
}

fn type_suffix(dtype: DataType) -> &'static str {
    match dtype {
        DataType::Float => "f32",
        DataType::Half => "f16",
        DataType::Bf16 => "bf16",
    }
}

/// Bytes of one rank's workspace serving messages up to `max_msg_bytes` among `nranks`.
pub(crate) fn workspace_bytes(max_msg_bytes: u64, nranks: i32) -> u64 {
    // SAFETY: pure arithmetic on the header's macros.
    unsafe { ear_workspace_bytes(max_msg_bytes, nranks) }
}

/// Offset of the abort word in a workspace (after the signal slots).
pub(crate) fn abort_offset() -> u64 {
    // SAFETY: returns a constant.
    unsafe { ear_abort_offset() }
}

/// Bytes of one rank's local state block.
pub(crate) fn state_bytes() -> usize {
    // SAFETY: returns a constant.
    unsafe { ear_state_bytes() as usize }
}

// kernels/layout.c: the header's macros as functions.
extern "C" {
    fn ear_fused_fits(
        rule: EarFusedFitRule,
        tokens: u64,
        hidden: u32,
        elem: u32,
        max_msg_bytes: u64,
        nranks: i32,
    ) -> i32;
    fn ear_workspace_bytes(max_msg_bytes: u64, nranks: i32) -> u64;
    fn ear_max_msg(rule: EarCapacityRule, max_msg_bytes: u64) -> u64;
    fn ear_state_bytes() -> u32;
    #[cfg(test)]
    fn ear_rank_counts(out: *mut i32, cap: i32) -> i32;
    fn ear_abort_offset() -> u64;
    #[cfg(test)]
    fn ear_params_size() -> u64;
    #[cfg(test)]
    fn ear_fused_params_size() -> u64;
}

#[cfg(test)]
mod tests;
