//! One rank's launch plan ([`Plan`], the contract's `EarPlan`): which kernel, its grid and block,
//! and the call flags. Grid and block come from `ear_plan_of` (`kernels/allreduce_params.h`,
//! through `kernels/layout.c`), the rule the kernel simulations call too; they depend on the call
//! alone, so every rank launches the same grid. The flags are decided here.

use super::family::{Family, Op};
use super::Message;
use crate::contract::{
    EarPlan, EAR_CALL_INPUT_SHARED, EAR_CALL_POINTERS, EAR_FAMILY_NORM, EAR_OP_ALLREDUCE, EAR_OP_RESIDUAL_RMSNORM,
};
use crate::tensor::DataType;

pub(crate) use crate::contract::EarPlan as Plan;

/// The plan of `family`'s kernel for `message` among `nranks` ranks, at most `max_blocks` CTAs
/// (clamped to the kernels' maximum); flags 0 (see [`call_flags`]).
pub(crate) fn kernel(family: Family, dtype: DataType, message: &Message, nranks: i32, max_blocks: u32) -> Plan {
    let elem = dtype.size() as u32;
    let (op, tokens, hidden) = match message.rows {
        Some((tokens, hidden)) => (EAR_OP_RESIDUAL_RMSNORM, tokens, hidden),
        None => (EAR_OP_ALLREDUCE, 0, 0),
    };
    let count = message.bytes / elem as u64;
    // SAFETY: pure arithmetic on the header's macros.
    unsafe { ear_plan(family.id(), op, count, tokens, hidden, elem, nranks, max_blocks, 0) }
}

/// The plan of the residual + RMSNorm kernel alone on `tokens` rows of `hidden` (one CTA per
/// row, up to 4 waves of the device's `sm_count` SMs: it waits on nothing, so any grid is right).
pub(crate) fn norm(tokens: u64, hidden: u32, dtype: DataType, sm_count: i32) -> Plan {
    // SAFETY: pure arithmetic on the header's macros.
    unsafe {
        ear_plan(
            EAR_FAMILY_NORM,
            EAR_OP_RESIDUAL_RMSNORM,
            tokens * hidden as u64,
            tokens,
            hidden,
            dtype.size() as u32,
            1,
            0,
            sm_count,
        )
    }
}

/// The op a plan's kernel computes.
pub(crate) fn op(message: &Message) -> Op {
    if message.rows.is_some() {
        Op::ResidualRmsNorm
    } else {
        Op::AllReduce
    }
}

/// `EarAllReduceParams::flags` of one rank's plain call of `family`: the 4+ rank one-shot and
/// two-shot of a group that exchanges pointers say so on every rank, and let peers read their
/// input in place where `reachable` (asked only then: it asks the driver) says they can: the
/// two-shot even in place (`output == input`: peers read our input only before we write
/// outside our own segment), the one-shot only out of place (it writes its output while peers
/// still read). Other families read no flag.
pub(crate) fn call_flags(family: Family, exchanges: bool, in_place: bool, reachable: impl FnOnce() -> bool) -> u32 {
    if !exchanges || !matches!(family, Family::OneShot | Family::TwoShot) {
        return 0;
    }
    let may_share = family == Family::TwoShot || !in_place;
    EAR_CALL_POINTERS | if may_share && reachable() { EAR_CALL_INPUT_SHARED } else { 0 }
}

/// Whether peers of a group of one process may read a rank's input in place, given where it
/// lies (`cuda::device_memory`: its device, and whether the peer access between primary
/// contexts reaches it): on the rank's own device, and reachable, or every rank on that device.
pub(crate) fn peers_reach(device: i32, one_device: bool, memory: Option<(i32, bool)>) -> bool {
    memory.is_some_and(|(at, reachable)| at == device && (reachable || one_device))
}

// kernels/layout.c.
extern "C" {
    #[allow(clippy::too_many_arguments)] // the C rule's arguments
    fn ear_plan(
        family: i32,
        op: i32,
        count: u64,
        tokens: u64,
        hidden: u32,
        elem: u32,
        nranks: i32,
        max_blocks: u32,
        sm_count: i32,
    ) -> EarPlan;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{EAR_BLOCK_THREADS, EAR_MAX_BLOCKS};

    fn plain(bytes: u64) -> Message {
        Message { bytes, rows: None }
    }

    fn grid_block(family: Family, vecs: u64, nranks: i32, cap: u32) -> (u32, u32) {
        let p = kernel(family, DataType::Half, &plain(vecs * 16), nranks, cap);
        (p.grid, p.block)
    }

    #[test]
    fn plain_grid_rules() {
        let grid = |vecs, cap| grid_block(Family::OneShot, vecs, 2, cap);
        assert_eq!(grid(1, 32), (1, EAR_BLOCK_THREADS));
        assert_eq!(grid(512 * 10, 32), (10, 512));
        assert_eq!(grid(1 << 30, 32), (32, 512));
        assert_eq!(grid_block(Family::TwoShot, 512 * 20, 2, 128), (10, 512), "two-shot: a segment per rank");
        // Lamport: blocks of 128..512 threads spread mid-size messages over max_blocks CTAs.
        let lamport = |vecs: u64, cap: u32| grid_block(Family::Lamport, vecs, 2, cap);
        assert_eq!(lamport(1, 64), (1, 128));
        assert_eq!(lamport(512, 64), (4, 128), "8 KiB");
        assert_eq!(lamport(4096, 64), (32, 128), "64 KiB");
        assert_eq!(lamport(32768, 128), (128, 256), "512 KiB");
        assert_eq!(lamport(32768, 64), (64, 512));
        assert_eq!(lamport(1 << 20, 64), (64, 512), "grid-stride beyond 512 threads x max_blocks");
        assert_eq!(lamport(100, 64), (1, 128));
        assert_eq!(grid(1 << 30, 1000), (EAR_MAX_BLOCKS, 512), "the cap is clamped to the kernels' maximum");
        let p = kernel(Family::OneShot, DataType::Float, &plain(64), 2, 8);
        assert_eq!((p.family, p.op, p.flags), (Family::OneShot.id(), EAR_OP_ALLREDUCE, 0));
    }

    #[test]
    fn fused_grid_rules() {
        let fused = |family: Family, tokens: u64, hidden: u32, cap: u32| {
            let p = kernel(
                family,
                DataType::Half,
                &Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) },
                2,
                cap,
            );
            (p.grid, p.block)
        };
        assert_eq!(fused(Family::OneShot, 1000, 4096, 32), (32, 512));
        assert_eq!(fused(Family::OneShot, 1, 256, 32), (1, 32));
        // The fused Lamport grid covers every vector once (one per thread), at least one CTA per row.
        let lamport = |t, h, cap| fused(Family::Lamport, t, h, cap).0;
        assert_eq!(lamport(1, 4096, 64), 1, "512 vectors: one CTA");
        assert_eq!(lamport(1, 16384, 128), 4, "one row, four CTAs push it");
        assert_eq!(lamport(32, 8192, 128), 64, "32 rows of 1024 vectors, 512 threads");
        assert_eq!(lamport(128, 8192, 128), 128, "256 CTAs would push one vector each: capped");
        assert_eq!(lamport(128, 8192, 64), 64);
        assert_eq!(lamport(100, 256, 64), 64, "rows of 32 vectors: one CTA per row, capped");
        assert_eq!(lamport(3, 256, 64), 3);
        let n = norm(10_000, 4096, DataType::Half, 132);
        assert_eq!((n.grid, n.block, n.family), (528, 512, EAR_FAMILY_NORM), "4 waves of 132 SMs");
    }

    #[test]
    fn only_groups_that_exchange_pointers_read_inputs_in_place() {
        let both = EAR_CALL_POINTERS | EAR_CALL_INPUT_SHARED;
        assert_eq!(call_flags(Family::OneShot, true, false, || true), both);
        assert_eq!(
            call_flags(Family::OneShot, true, true, || panic!("not asked in place")),
            EAR_CALL_POINTERS,
            "the one-shot in place copies"
        );
        assert_eq!(call_flags(Family::TwoShot, true, true, || true), both, "the two-shot may share in place");
        assert_eq!(
            call_flags(Family::TwoShot, true, false, || false),
            EAR_CALL_POINTERS,
            "unreachable memory: copied, pointers still exchanged"
        );
        assert_eq!(call_flags(Family::OneShot, false, false, || panic!("no exchange, no question")), 0);
        assert_eq!(call_flags(Family::Lamport, true, false, || panic!("Lamport reads no flag")), 0);
    }

    #[test]
    fn peers_read_an_input_in_place_only_where_they_reach_it() {
        assert!(
            peers_reach(1, false, Some((1, true))),
            "a cuMemAlloc allocation of the primary context, separate GPUs"
        );
        assert!(
            !peers_reach(1, false, Some((1, false))),
            "pool, VMM or another context's memory on separate GPUs: copied"
        );
        assert!(peers_reach(0, true, Some((0, false))), "simulated ranks: any memory of the one device");
        assert!(!peers_reach(1, false, Some((0, true))), "memory of another device than the rank's");
        assert!(!peers_reach(0, true, None), "host memory, or a pointer the driver does not know");
    }
}
