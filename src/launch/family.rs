//! The kernel families, each described once: its kernels' names and how they synchronise, which
//! messages it takes (fits), and its grid and block. The rules are the macros of
//! `kernels/allreduce_params.h`, called through `kernels/layout.c`, so Rust and CUDA read one
//! definition; the constants and parameter blocks are `crate::contract`'s.

use crate::contract::{EAR_FAMILY_LAMPORT, EAR_FAMILY_ONESHOT, EAR_FAMILY_TWOSHOT};
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
}

/// What a kernel computes after the reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// The sum, and nothing else.
    AllReduce,
    /// `residual_out = sum + bias + residual`, `normed = RMSNorm(residual_out) * gamma`.
    ResidualRmsNorm,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::OneShot, Family::TwoShot, Family::Lamport];

    /// The stem of the family's kernel names for `nranks` ranks, `<algorithm>_<sync>[_norm]`:
    /// `ear_<stem>_<t>_n<N>` (the `EAR_DEFINE_*KERNEL` lines at the end of its `.cu`).
    pub(crate) fn stem(self, op: Op, nranks: i32) -> &'static str {
        match (self, op) {
            // Stage, one flag barrier, pull (oneshot.cu).
            (Family::OneShot, Op::AllReduce) => "oneshot_barrier",
            // Data polled like Lamport's, above 8 MiB paced by per-chunk flags (twoshot.cu).
            (Family::TwoShot, Op::AllReduce) if nranks <= 2 => "twoshot_polled",
            // Local copy (or the input read in place), pull between two flag barriers (twoshot_wide.cu).
            (Family::TwoShot, Op::AllReduce) => "twoshot_barrier",
            // Push, the payload its own flag: no barrier (lamport.cu).
            (Family::Lamport, Op::AllReduce) => "oneshot_lamport",
            // The fused kernels (oneshot_norm.cu, twoshot_norm.cu, lamport_norm.cu): one barrier,
            // two barriers, none.
            (Family::OneShot, Op::ResidualRmsNorm) => "oneshot_barrier_norm",
            (Family::TwoShot, Op::ResidualRmsNorm) => "twoshot_barrier_norm",
            (Family::Lamport, Op::ResidualRmsNorm) => "oneshot_lamport_norm",
        }
    }

    /// Whether the family's kernel for `op` among `nranks` moves its data by writing into its
    /// peers' memory rather than reading from it: Lamport (both ops), the 2-rank two-shot
    /// (`twoshot_polled`: scatter and gather are pushes) and the fused two-shot (it pushes its
    /// slices and its residual_out, twoshot_norm.cu). The one-shot and the 4+ rank two-shot pull.
    /// Over PCIe, writes into peers can run at a fraction of reads (`crate::launch::strategy`'s PCIe model).
    pub fn writes_into_peers(self, op: Op, nranks: i32) -> bool {
        match (self, op) {
            (Family::Lamport, _) => true,
            (Family::TwoShot, Op::ResidualRmsNorm) => true,
            (Family::TwoShot, Op::AllReduce) => nranks <= 2,
            (Family::OneShot, _) => false,
        }
    }

    /// Largest plain message of this family in a workspace of `max_msg_bytes`.
    pub fn max_bytes(self, max_msg_bytes: u64) -> u64 {
        match self {
            Family::Lamport => lamport_max_bytes(max_msg_bytes),
            _ => max_msg_bytes,
        }
    }

    /// Whether a plain message of `bytes` fits the family's part of the workspace.
    pub(crate) fn fits(self, bytes: u64, max_msg_bytes: u64) -> bool {
        bytes <= self.max_bytes(max_msg_bytes)
    }

    /// Whether `tokens` rows of `hidden` elements of `elem` bytes fit the family's fused kernel.
    pub(crate) fn fused_fits(self, tokens: u64, hidden: u32, elem: usize, max_msg_bytes: u64, nranks: i32) -> bool {
        // SAFETY: pure arithmetic on the header's macros.
        unsafe { ear_fused_fits(self.id(), tokens, hidden, elem as u32, max_msg_bytes, nranks) != 0 }
    }

    /// The family's id in the kernels' contract (`EarPlan::family`).
    pub(crate) fn id(self) -> i32 {
        match self {
            Family::OneShot => EAR_FAMILY_ONESHOT,
            Family::TwoShot => EAR_FAMILY_TWOSHOT,
            Family::Lamport => EAR_FAMILY_LAMPORT,
        }
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

/// Largest message the Lamport family takes in a workspace of `max_msg_bytes`.
pub(crate) fn lamport_max_bytes(max_msg_bytes: u64) -> u64 {
    // SAFETY: pure arithmetic.
    unsafe { ear_lamport_max_msg(max_msg_bytes) }
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
    fn ear_fused_fits(family: i32, tokens: u64, hidden: u32, elem: u32, max_msg_bytes: u64, nranks: i32) -> i32;
    fn ear_workspace_bytes(max_msg_bytes: u64, nranks: i32) -> u64;
    fn ear_lamport_max_msg(max_msg_bytes: u64) -> u64;
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
mod tests {
    use super::*;
    use crate::contract::{EarAllReduceParams, EarFusedParams, EAR_MAX_BLOCKS};

    #[test]
    fn the_c_rules_see_the_rust_parameter_blocks() {
        // SAFETY: return constants.
        let (plain, fused) = unsafe { (ear_params_size(), ear_fused_params_size()) };
        assert_eq!(std::mem::size_of::<EarAllReduceParams>() as u64, plain);
        assert_eq!(std::mem::size_of::<EarFusedParams>() as u64, fused);
    }

    #[test]
    fn kernel_names_say_algorithm_and_sync() {
        assert_eq!(kernel_name(Family::Lamport, Op::AllReduce, DataType::Bf16, 8), "ear_oneshot_lamport_bf16_n8");
        assert_eq!(
            kernel_name(Family::OneShot, Op::ResidualRmsNorm, DataType::Half, 2),
            "ear_oneshot_barrier_norm_f16_n2"
        );
        assert_eq!(kernel_name(Family::TwoShot, Op::AllReduce, DataType::Float, 2), "ear_twoshot_polled_f32_n2");
        assert_eq!(kernel_name(Family::TwoShot, Op::AllReduce, DataType::Float, 16), "ear_twoshot_barrier_f32_n16");
        assert_eq!(norm_kernel_name(DataType::Float), "ear_residual_rmsnorm_f32");
    }

    #[test]
    fn which_kernels_push_into_peers() {
        // The stems say it: "polled" and "lamport" push, "barrier" pulls, except the fused
        // two-shot, which pushes slices between its barriers.
        for n in crate::launch::family::RANK_COUNTS {
            assert!(Family::Lamport.writes_into_peers(Op::AllReduce, n));
            assert!(Family::Lamport.writes_into_peers(Op::ResidualRmsNorm, n));
            assert!(!Family::OneShot.writes_into_peers(Op::AllReduce, n));
            assert!(!Family::OneShot.writes_into_peers(Op::ResidualRmsNorm, n));
            assert!(Family::TwoShot.writes_into_peers(Op::ResidualRmsNorm, n));
            assert_eq!(
                Family::TwoShot.writes_into_peers(Op::AllReduce, n),
                Family::TwoShot.stem(Op::AllReduce, n) == "twoshot_polled"
            );
        }
    }

    #[test]
    fn workspace_rule() {
        let small = workspace_bytes(1 << 20, 2);
        let large = workspace_bytes(16 << 20, 2);
        assert!(small >= 4 << 20 && large > small, "{small} {large}");
        assert!(workspace_bytes(16 << 20, 8) > large, "more ranks, more Lamport rows");
        assert_eq!(lamport_max_bytes(16 << 20), 2 << 20);
        assert_eq!(lamport_max_bytes(1 << 20), 1 << 20);
        assert_eq!(state_bytes(), 32 * EAR_MAX_BLOCKS as usize, "one copy of the counters per CTA index");
        assert_eq!(
            abort_offset(),
            8 * EAR_MAX_BLOCKS as u64 * crate::contract::EAR_MAX_RANKS as u64,
            "the abort word follows the signal slots"
        );
    }

    #[test]
    fn fits_rules() {
        assert!(Family::OneShot.fused_fits(128, 8192, 2, 16 << 20, 2));
        assert!(!Family::Lamport.fused_fits(1024, 8192, 2, 16 << 20, 2), "over the 2 MiB Lamport cap");
        assert!(Family::Lamport.fits(2 << 20, 16 << 20) && !Family::Lamport.fits((2 << 20) + 16, 16 << 20));
    }

    #[test]
    fn rank_counts_are_the_kernels_own() {
        let mut counts = [0i32; 16];
        // SAFETY: writes at most 16 entries into `counts`.
        let n = unsafe { ear_rank_counts(counts.as_mut_ptr(), counts.len() as i32) };
        assert_eq!(&counts[..n as usize], &RANK_COUNTS, "kernels/allreduce_params.h EAR_FOR_EACH_RANK_COUNT");
    }
}
