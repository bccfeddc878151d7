//! The host <-> kernel contract's constants and parameter blocks, defined once: cbindgen writes
//! `kernels/ear_contract.h` from this file (build.rs), the kernels include it through
//! `kernels/allreduce_params.h`, which builds the workspace layout and the launch rules on it.
//! Change anything here and the protocol id too.

// cbindgen exports `pub` items only, so they are `pub` here; the crate keeps the module private.
#![allow(unreachable_pub)]

use std::ffi::c_void;

/// Names the kernels' cross-rank protocol and the exchange record's layout ("EARA" read as
/// big-endian bytes): the one id of the contract (there is no other version number). Ranks
/// running builds with different ids never form a group: each rejects the other's records, so
/// all fall back to NCCL together instead of waiting on each other in kernels whose protocols
/// no longer match. "EAR4": flag values `flag_value(seq, i) = 64*seq + i + 1` (the two-shot
/// above 8 MiB publishes one flag per chunk). "EAR5": bounded waits, the abort word after the
/// signal slots, the fault word and timeout in the parameters, a 256-byte exchange record.
/// "EAR6": EAR5's bounded waits together with the two-shot at 4 and more ranks that pulls
/// between flag barriers (twoshot_wide.cu), and a 32 KiB signal region (the data region
/// 16 KiB-aligned again). "EAR7": a 48 KiB signal region whose third part holds the pointer
/// slots through which the 4+ rank two-shot tells its peers where to read its input
/// (`EAR_CALL_INPUT_SHARED`). "EAR8": a 64 KiB signal region whose pointer slots are 16-byte
/// {flag value, pointer} entries written and read as one atomic (no fence in place), the 4+
/// rank one-shot reading inputs in place too, with an end barrier, and the exchange only on
/// calls that say so (`EAR_CALL_POINTERS`). "EAR9": EAR8 with the peer self-test's area after
/// the data region (`EAR_SELFTEST_OFFSET`, `kernels/selftest.cu`): a longer workspace. "EARA":
/// EAR9 with the push family's region after the Lamport region (`EAR_OFF_PUSH`,
/// `kernels/push.cu`): a longer workspace; a self-test whose peer loads are optional
/// (`EarSelfTestParams::probe_reads`) and that times a push to the next rank
/// (`ear_selftest_push`), and a second exchange gather of three bytes a rank.
pub const EAR_PROTOCOL_ID: u32 = 0x4541_5241;

/// `EarAllReduceParams::flags`: peers may read this rank's input in place for this call (the
/// group lives in one process and the input is memory every rank's device reaches). The
/// one-shot and the 4+ rank two-shot then skip the copy into their workspace (the one-shot not when
/// its output is its input); other kernels ignore the flag. Each rank sets it for itself: a
/// peer learns it in-kernel, per call (`kernels/sync.cuh`, `cta_barrier_sharing`). Read only
/// together with [`EAR_CALL_POINTERS`].
#[allow(dead_code)] // ear_plan_of sets it, the kernels read it
pub const EAR_CALL_INPUT_SHARED: u32 = 1;

/// `EarAllReduceParams::flags`: the ranks of this call tell each other where to read their
/// inputs (the one-shot and the 4+ rank two-shot, sm_90 or newer). Set on EVERY rank of a call or on
/// none (the host sets it for groups that live in one process, on devices that all have the
/// 16-byte atomics): a rank that exchanges waits for pointers its peers never write.
#[allow(dead_code)] // ear_plan_of sets it, the kernels read it
pub const EAR_CALL_POINTERS: u32 = 2;

/// Fault codes: what a kernel writes into its fault word (`EarAllReduceParams::fault`, as
/// `generation << 8 | code`) and what a group's abort word holds (0: the group is live).
/// The values are also the C API's (`edgellmAllReduceLastError`).
///
/// A wait for a peer took longer than `timeout_ns`: the kernel stopped waiting (its output is
/// wrong) and aborted the group on every rank.
pub const EAR_FAULT_TIMEOUT: u32 = 1;
/// The group was aborted (a peer gave up waiting): the kernel did nothing, or stopped waiting.
pub const EAR_FAULT_ABORTED: u32 = 2;
/// The group was released by the host (a CUDA graph captured before the release was
/// replayed): the kernel did nothing.
pub const EAR_FAULT_RELEASED: u32 = 3;

/// Most ranks a kernel serves (the size of `peer_ws`).
pub const EAR_MAX_RANKS: usize = 16;

/// Largest grid a rank family accepts (the host also keeps the grid within the SM count: every
/// CTA of a call spins on its peers, so all must be co-resident).
pub const EAR_MAX_BLOCKS: u32 = 128;

/// The block of the one-shot and two-shot kernels, and the largest Lamport block (as
/// TensorRT-LLM's DEFAULT_BLOCK_SIZE).
#[allow(dead_code)] // the header macros and the plan rule read it
pub const EAR_BLOCK_THREADS: u32 = 512;

/// The largest block of the fused kernels (one thread per 16-byte vector of a row). Only the
/// kernels read it; the host takes the block from the plan rule (`ear_plan_of`).
#[allow(dead_code)]
pub const EAR_FUSED_MAX_THREADS: u32 = 512;

/// `EarPlan::family` of the residual + RMSNorm kernel alone (after NCCL or a plain all-reduce, or
/// one rank). The families' ids are their descriptions' (`crate::launch::family`, written into
/// `kernels/ear_families.h` as `EAR_FAMILY_<NAME>`): none takes this one.
#[allow(dead_code)] // ear_norm_plan_of sets it
pub const EAR_FAMILY_NORM: i32 = 3;

/// `EarPlan::op`: the sum alone, or the fused residual (+ bias) + RMSNorm after it.
pub const EAR_OP_ALLREDUCE: i32 = 0;
pub const EAR_OP_RESIDUAL_RMSNORM: i32 = 1;

/// How a family's plain calls size their grid and block (`ear_plan_of`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarGridRule {
    /// One thread per 16-byte vector of the message, [`EAR_BLOCK_THREADS`] per CTA (`EAR_GRID`).
    Vecs,
    /// As `Vecs` over one rank's segment of the message (ceil(vecs / nranks) vectors).
    Segments,
    /// `EAR_LAMPORT_GRID` CTAs of `EAR_LAMPORT_BLOCK` threads (128..512).
    Lamport,
}

/// How a family's fused calls size their grid (the block is `EAR_FUSED_BLOCK` for all).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarFusedGridRule {
    /// One CTA per token row (`EAR_FUSED_GRID`).
    Rows,
    /// One CTA per row, enough to push every vector once, and a few-row call's push spread
    /// over max(4, N) CTAs (`ear_fused_lamport_grid_of`).
    Lamport,
}

/// The largest plain message of a family in a workspace made for `m` bytes (`ear_max_msg_of`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarCapacityRule {
    /// `m` itself.
    Workspace,
    /// `EAR_LAMPORT_MAX_MSG(m)`: the Lamport rows are capped at 2 MiB.
    Lamport,
    /// `EAR_PUSH_MAX_MSG(m)`: the staged push rows are capped at 1 MiB.
    Push,
}

/// Which fused calls fit a family's part of the workspace (`ear_fused_fits_of`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarFusedFitRule {
    Oneshot,
    Twoshot,
    Lamport,
    Push,
}

/// Which `EAR_CALL_*` flags a family's plain kernels read (`ear_plan_of`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarFlagsRule {
    /// None: its kernels ignore the flags.
    None,
    /// [`EAR_CALL_POINTERS`] in groups that exchange pointers, and [`EAR_CALL_INPUT_SHARED`]
    /// where peers reach the input, unless the call is in place (the kernel writes its output
    /// while peers may still read its input).
    PointersOutOfPlace,
    /// The same, in place too (peers read the input before the kernel writes outside its own
    /// segment).
    PointersAlways,
}

/// A family's launch rules: what `ear_plan_of` and the fit checks need of it. The Rust core
/// describes each family once (`crate::launch::family`) and hands its rule to C; C knows the rule
/// kinds, never the families.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EarRule {
    pub grid: EarGridRule,
    pub fused_grid: EarFusedGridRule,
    pub capacity: EarCapacityRule,
    pub fused_fit: EarFusedFitRule,
    pub flags: EarFlagsRule,
}

/// What a rank knows of one plain call besides its size, for its flags (`ear_plan_of`); each
/// field 0 or 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EarCallFacts {
    /// The group tells its ranks where their inputs are (`EAR_CALL_POINTERS`): it lives in one
    /// process, and every rank's kernels and links have the 16-byte atomics.
    pub exchanges_pointers: u8,
    /// Output and input are the same buffer.
    pub in_place: u8,
    /// Every peer's device reaches this rank's input where it lies.
    pub input_reachable: u8,
    pub reserved: u8,
}

/// One rank's launch of one call, from the one rule `ear_plan_of` (`kernels/allreduce_params.h`)
/// that the library and the kernel simulations share: which kernel (family and op; the type and
/// rank count pick its instance), its grid and block (the same on every rank), and the
/// `EAR_CALL_*` flags of its parameter block (from the family's [`EarFlagsRule`] and the call's
/// [`EarCallFacts`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EarPlan {
    pub family: i32,
    pub op: i32,
    pub grid: u32,
    pub block: u32,
    pub flags: u32,
}

/// The only kernel argument of the plain families, passed by value. 200 bytes, 8-byte aligned,
/// no implicit padding (64-bit targets only).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EarAllReduceParams {
    /// Base of each rank's workspace as mapped in this process, index = rank; entry `rank` is
    /// our own allocation. Entries >= nranks are ignored (set them to NULL).
    pub peer_ws: [*mut c_void; EAR_MAX_RANKS],
    /// Our local state block (EAR_STATE_BYTES, zero-filled once).
    pub state: *mut c_void,
    /// count elements of the call's dtype, 16-byte aligned.
    pub input: *const c_void,
    /// count elements, 16-byte aligned; may equal input.
    pub output: *mut c_void,
    /// Number of elements (>= 1), identical on every rank.
    pub count: u64,
    /// The max_msg_bytes `m` the workspaces were created with (identical on every rank).
    pub ws_max_bytes: u64,
    /// This process's rank in [0, nranks).
    pub rank: i32,
    /// Number of ranks; must equal the N of the kernel's name.
    pub nranks: i32,
    /// This rank's fault word, in host-visible memory (mapped pinned): the kernel writes
    /// `generation << 8 | EAR_FAULT_*` there when it gives up or finds its group aborted, so
    /// the host reads it without synchronizing. NULL: not recorded.
    pub fault: *mut u64,
    /// Longest a wait for a peer may take, in nanoseconds (`%globaltimer`); 0: no bound.
    pub timeout_ns: u64,
    /// The group's generation (>= 1), recorded with a fault so the host tells groups apart.
    pub generation: u32,
    /// `EAR_CALL_*` bits of this call; 0 for none.
    pub flags: u32,
}

/// The peer self-test (`kernels/selftest.cu`, `crate::group::selftest`): the high 32 bits of every token
/// (`EAR_SELFTEST_TOKEN`, `kernels/allreduce_params.h`), so that no token is ever zero, the value
/// of a freshly zero-filled workspace. Also the first word of a rank's gathered verdict.
pub const EAR_SELFTEST_MAGIC: u32 = 0x5E1F_7E57;

/// The threads of `ear_selftest`'s one CTA (lane q checks rank q); its grid is 1.
pub const EAR_SELFTEST_THREADS: u32 = 32;

/// `EarSelfTestResult::write` and `::read` entries: not decided yet (a kernel that has not
/// finished; also the rank's own entry and entries >= nranks, never written). The host takes
/// every entry but PASSED, WRONG and UNMAPPED alike (`selftest::decide`).
#[allow(dead_code)]
pub const EAR_SELFTEST_PENDING: u32 = 0;
/// The exact token arrived (write) or was read (read) within the bound.
pub const EAR_SELFTEST_PASSED: u32 = 1;
/// The bound passed with nothing there: zero, or the token of an earlier round (write: the
/// peer's store never arrived; read: the loads never returned the peer's token).
#[allow(dead_code)]
pub const EAR_SELFTEST_NOT_SEEN: u32 = 2;
/// The bound passed with another value there than the token: the path garbles data.
pub const EAR_SELFTEST_WRONG: u32 = 3;
/// The host gave no address for the peer's workspace (its mapping failed): nothing was written
/// to it or read from it (read entries only).
pub const EAR_SELFTEST_UNMAPPED: u32 = 4;
/// The read path was not probed (`EarSelfTestParams::probe_reads` 0: no family that loads from
/// peers may run on the group): no load was issued (read entries only).
pub const EAR_SELFTEST_SKIPPED: u32 = 5;

/// What one rank's `ear_selftest` reports, in host-mapped memory (the host reads it after the
/// kernel ended, or, for a kernel that did not end, as far as it got). 152 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EarSelfTestResult {
    /// `EAR_SELFTEST_TOKEN(rank, rank, round)` once every entry below is final (written last,
    /// after a system fence); anything else: the kernel has not finished.
    pub done: u64,
    /// `%globaltimer` nanoseconds from the kernel's start to its verdict.
    pub elapsed_ns: u64,
    /// `write[q]`: how rank q's token for this rank arrived in this rank's workspace (the path
    /// q -> rank, a peer's stores); `EAR_SELFTEST_*`.
    pub write: [u32; EAR_MAX_RANKS],
    /// `read[q]`: what this rank's loads of rank q's own slot returned (the path rank -> q, a
    /// peer's memory read over the link); `EAR_SELFTEST_*`.
    pub read: [u32; EAR_MAX_RANKS],
    /// `ear_selftest_push`'s time: the longest any of its CTAs took to store its share into the
    /// next rank's workspace, until its stores were performed system-wide (ns; 0: not run).
    pub push_ns: u64,
}

/// The CTAs and threads of `ear_selftest_push`, and the most it stores: a short bandwidth check
/// of the link to the next rank (tens of microseconds on a healthy link).
pub const EAR_SELFTEST_PUSH_CTAS: u32 = 8;
pub const EAR_SELFTEST_PUSH_THREADS: u32 = 512;
pub const EAR_SELFTEST_PUSH_BYTES: u64 = 256 << 10;

/// The only argument of `ear_selftest_push`, by value: it stores `bytes` (a multiple of 16) from
/// `src` (local) into `dst` (the next rank's workspace) and records its time in `result`. Launch:
/// grid [`EAR_SELFTEST_PUSH_CTAS`], block [`EAR_SELFTEST_PUSH_THREADS`], after `ear_selftest`
/// on the same stream. 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EarSelfTestPushParams {
    pub dst: *mut c_void,
    pub src: *const c_void,
    pub bytes: u64,
    pub result: *mut EarSelfTestResult,
}

/// The only argument of `ear_selftest`, passed by value. 176 bytes, 8-byte aligned, no
/// implicit padding (64-bit targets only). Launch: grid 1, block `EAR_SELFTEST_THREADS`, no
/// dynamic shared memory, no PDL.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EarSelfTestParams {
    /// Base of each rank's workspace as mapped in this process, index = rank; entry `rank` is
    /// our own allocation (never NULL). A NULL peer entry: its mapping failed; the kernel
    /// neither writes to nor reads from it (`EAR_SELFTEST_UNMAPPED`). Entries >= nranks are
    /// ignored.
    pub peer_ws: [*mut c_void; EAR_MAX_RANKS],
    /// This rank's result block (host-mapped, zero-filled by the host).
    pub result: *mut EarSelfTestResult,
    /// The max_msg_bytes `m` the workspaces were created with: the self-test area lies at
    /// `EAR_SELFTEST_OFFSET(m, nranks)`.
    pub ws_max_bytes: u64,
    /// How long the kernel waits for its peers' tokens, in nanoseconds (`%globaltimer`, from the
    /// kernel's start); 0 looks once.
    pub timeout_ns: u64,
    /// This rank in [0, nranks).
    pub rank: i32,
    /// Number of ranks, 1 to EAR_MAX_RANKS (the kernel serves every count).
    pub nranks: i32,
    /// Identical on every rank, different for each self-test of the same workspaces (16 bits
    /// are used): a token left by an earlier round is never taken for this round's.
    pub round: u32,
    /// Fault injection (tests): bit p set, this rank does not write its token to peer p.
    pub skip_mask: u32,
    /// Fault injection (tests): bit p set (p != rank), this rank writes a wrong token to peer p;
    /// bit `rank` set, a wrong token into its own slot (every peer's read of it is wrong).
    pub garble_mask: u32,
    /// 1: the read path is probed too (a load from every peer's workspace); 0: the kernel issues
    /// no peer load (where no pulling family may run, a load that might never return is not
    /// risked) and reports the reads [`EAR_SELFTEST_SKIPPED`]. The same on every rank.
    pub probe_reads: u32,
}

/// The only argument of the fused all-reduce + residual (+ bias) + RMSNorm kernels, passed by
/// value. 256 bytes, 8-byte aligned, no implicit padding (64-bit targets only).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EarFusedParams {
    /// The all-reduce part, exactly as for the plain kernels: ar.input = x [tokens, hidden]
    /// (this rank's partial sum), ar.count = tokens * hidden; ar.output is ignored. For
    /// ear_residual_rmsnorm_<t> only ar.input and ar.count are read.
    pub ar: EarAllReduceParams,
    /// [tokens, hidden], read; may equal residual_out.
    pub residual: *const c_void,
    /// [hidden] or NULL (no bias).
    pub bias: *const c_void,
    /// [hidden] RMSNorm weight.
    pub gamma: *const c_void,
    /// [tokens, hidden] = sum(x) + bias + residual, rounded to T once.
    pub residual_out: *mut c_void,
    /// [tokens, hidden] = RMSNorm(residual_out) * gamma; may equal x (ar.input).
    pub normed: *mut c_void,
    /// Token rows (>= 1).
    pub tokens: u64,
    /// Elements per row (>= 1).
    pub hidden: u32,
    /// RMSNorm epsilon (added to the mean square).
    pub eps: f32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn parameter_blocks_have_the_sizes_the_kernels_assert() {
        // kernels/allreduce_params.h static_asserts the same sizes on the C side.
        assert_eq!(size_of::<EarAllReduceParams>(), 200);
        assert_eq!(offset_of!(EarAllReduceParams, rank), 168);
        assert_eq!(offset_of!(EarAllReduceParams, fault), 176);
        assert_eq!(size_of::<EarFusedParams>(), 256);
        assert_eq!(offset_of!(EarFusedParams, eps), 252);
        assert_eq!(size_of::<EarSelfTestParams>(), 176);
        assert_eq!(offset_of!(EarSelfTestParams, rank), 152);
        assert_eq!(size_of::<EarSelfTestResult>(), 152);
        assert_eq!(size_of::<EarSelfTestPushParams>(), 32);
        assert_eq!(offset_of!(EarSelfTestResult, read), 80);
    }

    /// build.rs generates the header into OUT_DIR; the committed copy (what the kernels and the
    /// simulations include) must be the same text.
    #[test]
    fn the_committed_contract_header_is_the_generated_one() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/ear_contract.h"));
        assert!(
            generated == include_str!("../kernels/ear_contract.h"),
            "kernels/ear_contract.h is stale: rebuild with EDGELLM_WRITE_GENERATED=1 to rewrite it from src/contract.rs"
        );
    }

    #[test]
    fn the_protocol_id_reads_eara() {
        assert_eq!(&EAR_PROTOCOL_ID.to_be_bytes(), b"EARA");
    }
}
