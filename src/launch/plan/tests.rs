use super::*;
use crate::contract::{EAR_BLOCK_THREADS, EAR_CALL_INPUT_SHARED, EAR_CALL_POINTERS, EAR_FAMILY_NORM, EAR_MAX_BLOCKS};

const NO_FACTS: EarCallFacts = EarCallFacts { exchanges_pointers: 0, in_place: 0, input_reachable: 0, reserved: 0 };

fn plain(bytes: u64) -> Message {
    Message { bytes, rows: None }
}

fn grid_block(family: Family, vecs: u64, nranks: i32, cap: u32) -> (u32, u32) {
    let p = kernel(family, DataType::Half, &plain(vecs * 16), nranks, cap, NO_FACTS);
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
    let p = kernel(Family::OneShot, DataType::Float, &plain(64), 2, 8, NO_FACTS);
    assert_eq!((p.family, p.op, p.flags), (Family::OneShot.id(), EAR_OP_ALLREDUCE, 0));
}

#[test]
fn fused_grid_rules() {
    let fused_n = |family: Family, tokens: u64, hidden: u32, nranks: i32, cap: u32| {
        let message = Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) };
        let p = kernel(family, DataType::Half, &message, nranks, cap, NO_FACTS);
        (p.grid, p.block)
    };
    let fused = |family: Family, tokens: u64, hidden: u32, cap: u32| fused_n(family, tokens, hidden, 2, cap);
    assert_eq!(fused(Family::OneShot, 1000, 4096, 32), (32, 512));
    assert_eq!(fused(Family::OneShot, 1, 256, 32), (1, 32));
    // The fused Lamport grid: one CTA per row, enough to push every vector once (one per
    // thread), and a few rows' push spread over max(4, N) CTAs of at least 64 vectors each.
    let lamport = |t, h, cap| fused(Family::Lamport, t, h, cap).0;
    assert_eq!(lamport(1, 4096, 64), 4, "512 vectors: spread over 4 CTAs");
    assert_eq!(fused_n(Family::Lamport, 1, 4096, 8, 16).0, 8, "8 ranks: 8 CTAs");
    assert_eq!(fused_n(Family::Lamport, 1, 4096, 16, 8).0, 8, "16 ranks: capped");
    assert_eq!(fused_n(Family::Lamport, 8, 4096, 8, 16).0, 8, "8 rows: one CTA per row");
    assert_eq!(lamport(1, 16384, 128), 4, "one row, four CTAs push it");
    assert_eq!(lamport(1, 256, 64), 1, "32 vectors: no CTA of less than 64");
    assert_eq!(lamport(1, 1024, 64), 2, "128 vectors: two CTAs of 64");
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
    let flags = |family: Family, exchanges: bool, in_place: bool, reachable: bool| {
        let facts = EarCallFacts {
            exchanges_pointers: exchanges as u8,
            in_place: in_place as u8,
            input_reachable: reachable as u8,
            reserved: 0,
        };
        kernel(family, DataType::Half, &plain(4096), 4, 8, facts).flags
    };
    let both = EAR_CALL_POINTERS | EAR_CALL_INPUT_SHARED;
    assert_eq!(flags(Family::OneShot, true, false, true), both);
    assert_eq!(flags(Family::OneShot, true, true, true), EAR_CALL_POINTERS, "the one-shot in place copies");
    assert_eq!(flags(Family::TwoShot, true, true, true), both, "the two-shot may share in place");
    assert_eq!(flags(Family::TwoShot, true, false, false), EAR_CALL_POINTERS, "unreachable memory: copied");
    assert_eq!(flags(Family::OneShot, false, false, true), 0, "no exchange, no flags");
    assert_eq!(flags(Family::Lamport, true, false, true), 0, "Lamport reads no flag");
    // A fused call's kernel reads no flag either.
    let message = Message { bytes: 8192, rows: Some((1, 4096)) };
    let facts = EarCallFacts { exchanges_pointers: 1, in_place: 0, input_reachable: 1, reserved: 0 };
    assert_eq!(kernel(Family::OneShot, DataType::Half, &message, 4, 8, facts).flags, 0);
}

#[test]
fn peers_read_an_input_in_place_only_where_they_reach_it() {
    assert!(peers_reach(1, false, Some((1, true))), "a cuMemAlloc allocation of the primary context, separate GPUs");
    assert!(!peers_reach(1, false, Some((1, false))), "pool, VMM or another context's memory on separate GPUs: copied");
    assert!(peers_reach(0, true, Some((0, false))), "simulated ranks: any memory of the one device");
    assert!(!peers_reach(1, false, Some((0, true))), "memory of another device than the rank's");
    assert!(!peers_reach(0, true, None), "host memory, or a pointer the driver does not know");
}

struct Group2;
impl Fits for Group2 {
    fn nranks(&self) -> i32 {
        2
    }
    fn serves(&self, family: Family, _: DataType, m: &Message) -> bool {
        family.fits(m.bytes, 16 << 20)
    }
}

fn facts(group: Option<&dyn Fits>, owns: bool) -> Facts<'_> {
    Facts { group, max_blocks: 64, stream_owns_rank: owns, call: NO_FACTS, sm_count: 132 }
}

#[test]
fn a_plan_names_every_kernel_it_launches() {
    let call =
        |bytes, rows| Call { tp_size: 2, dtype: DataType::Bf16, message: Message { bytes, rows }, aligned: true };
    let lamport = plan(Requested::Auto, &call(8192, None), &facts(Some(&Group2), true), None);
    assert_eq!(lamport.decision.path, Path::Custom(Family::Lamport));
    let (family, k) = lamport.kernel.unwrap();
    assert_eq!((family, k), (Family::Lamport, kernel(Family::Lamport, DataType::Bf16, &plain(8192), 2, 64, NO_FACTS)));
    assert_eq!(lamport.norm, None);
    // Another stream than the rank's: NCCL, and it says why.
    let other = plan(Requested::Auto, &call(8192, None), &facts(Some(&Group2), false), None);
    assert_eq!((other.decision.path, other.decision.fallback), (Path::Nccl, Some(Fallback::OtherStream)));
    assert_eq!(other.kernel, None);
    // The fused op on NCCL: the norm kernel after the sum.
    let fused = plan(Requested::Nccl, &call(8192, Some((1, 4096))), &facts(Some(&Group2), true), None);
    assert_eq!((fused.decision.path, fused.kernel), (Path::Nccl, None));
    assert_eq!(fused.norm, Some(norm(1, 4096, DataType::Bf16, 132)));
    // No group: NCCL; one rank: a copy, no kernel.
    assert_eq!(plan(Requested::Auto, &call(8192, None), &facts(None, true), None).decision.path, Path::Nccl);
    let one = Call { tp_size: 1, ..call(8192, None) };
    assert_eq!(plan(Requested::Auto, &one, &facts(None, true), None).kernel, None);
}
