//! The peer self-test (issue 29): before the custom kernels of a group are trusted, every rank
//! runs `ear_selftest` (`kernels/selftest.cu`, whose top explains the protocol) once: it writes a
//! token into every peer's workspace and reads every peer's own token over the links, bounded in
//! time. A fabric that drops, garbles or stalls peer-to-peer traffic (PCIe ACS, an IOMMU in the
//! way) is found here, in well under a second, instead of as all-reduces that hang until their
//! bound or sum garbage.
//!
//! - One process drives every rank ([`run_in_process`], [`Group::self_test`]): one launch per
//!   rank, each on a stream of its own device, all at once; then [`decide`].
//! - One rank per process: each runs [`run_one_rank`] and gets its [`RankVerdict`]; the ranks
//!   gather each other's ([`RankVerdict::encode`], [`VERDICT_BYTES`] each; a rank whose verdict is
//!   missing or garbled decodes as [`RankState::NotRun`]), and every rank runs [`decide`] on the
//!   same verdicts: all reach the same decision and name the same pair.
//!
//! Bounds: the kernel waits at most `EDGELLM_ALLREDUCE_SELFTEST_MS` (default 50 ms, `0`: no
//! self-test, unsafe) for its peers' tokens ([`Bounds::configured`]); a healthy group passes in
//! microseconds. The host never blocks on the kernels (no `cuStreamSynchronize`): it polls their
//! streams (`cuStreamQuery`) with short sleeps until a deadline of its own, [`HOST_GRACE`] after
//! the kernel's bound.
//!
//! A kernel that did not finish by then (a load from a peer's memory that never returns, which
//! no kernel can bound) is reported as [`SelfTestKind::DidNotFinish`]. It may still run, and
//! still touch its result block, its workspace and its peers': the host then leaks the result
//! block and the kernel's stream, and the caller must never free the workspaces either (freeing
//! synchronizes the device, which would block for ever): [`SelfTestFailure::kernels_may_still_run`]
//! says so, and [`Group::self_test`] marks its group so that it is never freed (`Group::wedge`).
//! The device stays unusable for anything that waits for all of its work (a context
//! synchronize, a free) until the process exits or the GPU is reset.

use crate::contract::{
    EarSelfTestParams, EarSelfTestPushParams, EarSelfTestResult, EAR_MAX_RANKS, EAR_SELFTEST_MAGIC,
    EAR_SELFTEST_PASSED, EAR_SELFTEST_PUSH_CTAS, EAR_SELFTEST_PUSH_THREADS, EAR_SELFTEST_SKIPPED, EAR_SELFTEST_THREADS,
    EAR_SELFTEST_UNMAPPED, EAR_SELFTEST_WRONG,
};
use crate::cuda::{DevicePtr, Function, MappedHost, OwnedStream};
use crate::error::{Error, Result, SelfTestFailure, SelfTestKind, SelfTestProblem};
use crate::group::{device, Group};
use crate::launch::launcher::Launch;
use std::time::{Duration, Instant};

mod injection;
mod verdict;

// Public for the integration tests' hooks (lib.rs, feature `test-hooks`), crate-wide otherwise.
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub use injection::*;
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub use verdict::*;

/// The slowest push the bandwidth check takes (MB/s): a fabric whose peer writes run at a small
/// fraction of a PCIe x16 link's ~25 GB/s (Gen4) takes NCCL, which is faster there. 4 GB/s is a
/// sixth of it, above the 2.6 GB/s of peer writes measured on a 16-GPU fabric that routes them
/// through the root complex (local-inference-lab/b12x#139), below what one PCIe Gen3 x16 or Gen4
/// x8 link carries.
pub(crate) const MIN_PUSH_MBPS: u32 = 4000;

/// How long the host waits beyond the kernel's bound before it reports a kernel as not finished:
/// covers the launches and the start of the kernels (a healthy kernel ends within its bound).
pub(crate) const HOST_GRACE: Duration = Duration::from_secs(1);

/// The host's pause between two looks at the kernels' streams.
const POLL: Duration = Duration::from_micros(200);

/// How long the self-test may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// How long each kernel waits for its peers' tokens (from its own start).
    pub kernel: Duration,
    /// How long the host waits for the kernels (from before the first launch).
    pub host: Duration,
}

impl Bounds {
    pub(crate) fn new(kernel: Duration) -> Bounds {
        Bounds { kernel, host: kernel.saturating_add(HOST_GRACE) }
    }

    /// `EDGELLM_ALLREDUCE_SELFTEST_MS`; None when it is 0 (no self-test: unsafe).
    pub(crate) fn configured() -> Option<Bounds> {
        let ms = crate::config::get().selftest_ms;
        (ms > 0).then(|| Bounds::new(Duration::from_millis(ms)))
    }

    fn kernel_ns(&self) -> u64 {
        self.kernel.as_nanos().min(1 << 62) as u64
    }
}

/// Fault injection for one rank's kernel (tests; all zero otherwise).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RankInjection {
    /// Bit p: the rank does not write its token to rank p.
    pub skip_mask: u32,
    /// Bit p (p != rank): the rank writes a wrong token to rank p; bit `rank`: a wrong token into
    /// its own slot.
    pub garble_mask: u32,
    /// The host does not launch the rank's kernel.
    pub not_launched: bool,
    /// Whether the read path is probed, instead of the group's answer.
    pub probe_reads: Option<bool>,
    /// Whether the bandwidth check runs, instead of the group's answer.
    pub measure_push: Option<bool>,
}

/// What one rank's kernel needs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RankSelfTest {
    pub rank: i32,
    pub nranks: i32,
    pub device: i32,
    /// `ear_selftest` of the rank's device (`DeviceKernels::selftest`).
    pub function: Function,
    /// Every rank's workspace as this rank's process addresses it; entry `rank` is the rank's
    /// own. NULL for a peer whose workspace could not be mapped (reported as
    /// [`SelfTestKind::MappingFailed`]).
    pub peer_ws: [DevicePtr; EAR_MAX_RANKS],
    /// The `max_bytes` the workspaces were created with (where their self-test area lies).
    pub max_bytes: u64,
    /// Identical on every rank; new for each self-test of the same workspaces (1 for the first).
    pub round: u32,
    /// Whether the read path is probed (identical on every rank: `Group::pulls`).
    pub probe_reads: bool,
    /// The bandwidth check into the next rank (on groups whose ranks are on separate GPUs).
    pub push: Option<PushCheck>,
    pub inject: RankInjection,
}

/// What a rank's bandwidth check stores, and where (`ear_selftest_push`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PushCheck {
    pub function: Function,
    /// The next rank's one-shot bank 0 (no call reads it before staging it again).
    pub dst: DevicePtr,
    /// This rank's one-shot bank 1.
    pub src: DevicePtr,
    /// At most `EAR_SELFTEST_PUSH_BYTES`, a multiple of 16.
    pub bytes: u64,
}

impl RankSelfTest {
    fn params(&self, result: *mut EarSelfTestResult, bounds: Bounds) -> EarSelfTestParams {
        EarSelfTestParams {
            peer_ws: self.peer_ws.map(DevicePtr::as_mut),
            result,
            ws_max_bytes: self.max_bytes,
            timeout_ns: bounds.kernel_ns(),
            rank: self.rank,
            nranks: self.nranks,
            round: self.round,
            skip_mask: self.inject.skip_mask,
            garble_mask: self.inject.garble_mask,
            probe_reads: self.probe_reads as u32,
        }
    }
}

/// How the host saw one rank's kernel.
#[derive(Clone, Debug, PartialEq)]
enum Run {
    /// Not launched (why, when it was meant to be).
    Absent(Option<String>),
    Running,
    Finished,
    Faulted(String),
    Unfinished,
}

/// Runs the kernels of `ranks` (each on a new stream of its device; all launched before any is
/// waited for), waits for them until `bounds.host` has passed, and returns each one's verdict,
/// with what the host saw besides (a CUDA error) in words. Memory a kernel that did not finish
/// may touch is leaked (the module's documentation).
fn run_ranks(ranks: &[RankSelfTest], bounds: Bounds) -> Vec<(RankVerdict, Option<String>)> {
    let Some(first) = ranks.first() else {
        return Vec::new();
    };
    let not_run = |why: String| {
        ranks.iter().map(|r| (RankVerdict::not_run(r.rank, r.nranks, r.device), Some(why.clone()))).collect()
    };
    // One result block per rank, in memory every device writes and the host reads as it goes.
    let bytes = std::mem::size_of::<EarSelfTestResult>() * ranks.len();
    let blocks = match device::with_device(first.device, || MappedHost::zeroed(bytes)) {
        Ok(blocks) => blocks,
        Err(e) => return not_run(format!("allocating the self-test's result blocks: {e}")),
    };
    let block = |i: usize| blocks.ptr().cast::<EarSelfTestResult>().wrapping_add(i);

    let start = Instant::now();
    let mut streams: Vec<Option<OwnedStream>> = Vec::with_capacity(ranks.len());
    let mut runs: Vec<Run> = Vec::with_capacity(ranks.len());
    for (i, r) in ranks.iter().enumerate() {
        if r.inject.not_launched {
            streams.push(None);
            runs.push(Run::Absent(None));
            continue;
        }
        let params = r.params(block(i), bounds);
        let launched = device::with_device(r.device, || {
            let stream = OwnedStream::non_blocking()?;
            let launch = Launch { function: r.function, grid: 1, block: EAR_SELFTEST_THREADS, pdl: false };
            // SAFETY: the kernel's own parameter block: the workspaces are the group's (alive
            // while the caller holds it, and never freed if this kernel does not finish), the
            // result block is ours (leaked if it does not finish); grid 1, its block size.
            unsafe { launch.run(&params, stream.stream()) }?;
            if let Some(p) = &r.push {
                let launch = Launch {
                    function: p.function,
                    grid: EAR_SELFTEST_PUSH_CTAS,
                    block: EAR_SELFTEST_PUSH_THREADS,
                    pdl: false,
                };
                let params = EarSelfTestPushParams {
                    dst: p.dst.as_mut(),
                    src: p.src.as_const(),
                    bytes: p.bytes,
                    result: block(i),
                };
                // SAFETY: its own parameter block: `bytes` of the next rank's bank 0 and of ours
                // (the group's workspaces, kept as above), the result block as above.
                unsafe { launch.run(&params, stream.stream()) }?;
            }
            Ok(stream)
        });
        match launched {
            Ok(stream) => {
                streams.push(Some(stream));
                runs.push(Run::Running);
            }
            Err(e) => {
                streams.push(None);
                runs.push(Run::Absent(Some(format!("launching its kernel on device {}: {e}", r.device))));
            }
        }
    }

    // Waits by polling: a kernel that never ends must not take the host with it.
    let deadline = start + bounds.host;
    loop {
        let mut pending = false;
        for (i, run) in runs.iter_mut().enumerate() {
            let Some(stream) = streams[i].as_ref().filter(|_| *run == Run::Running) else {
                continue;
            };
            match device::with_device(ranks[i].device, || stream.finished()) {
                Ok(true) => *run = Run::Finished,
                Ok(false) => pending = true,
                Err(e) => *run = Run::Faulted(format!("its kernel on device {} failed: {e}", ranks[i].device)),
            }
        }
        if !pending {
            break;
        }
        if Instant::now() >= deadline {
            runs.iter_mut().filter(|run| **run == Run::Running).for_each(|run| *run = Run::Unfinished);
            break;
        }
        std::thread::sleep(POLL);
    }

    // The verdicts. A finished kernel's block is complete (its stream completed); an unfinished
    // one's is read as far as it got.
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
    let verdicts: Vec<(RankVerdict, Option<String>)> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| {
            // SAFETY: block i of the allocation, which holds ranks.len() blocks and is alive.
            let result = unsafe { read_block(block(i)) };
            let done = result.done == selftest_token(r.rank as u32, r.rank as u32, r.round);
            let (state, detail) = match &runs[i] {
                Run::Finished if done => (RankState::Finished, None),
                Run::Finished => {
                    (RankState::Faulted, Some(format!("its kernel on device {} ended without its verdict", r.device)))
                }
                Run::Unfinished => (RankState::Unfinished, None),
                Run::Faulted(why) => (RankState::Faulted, Some(why.clone())),
                Run::Absent(why) => (RankState::NotRun, why.clone()),
                Run::Running => (RankState::Unfinished, None),
            };
            let mut verdict = RankVerdict::not_run(r.rank, r.nranks, r.device);
            verdict.state = state;
            if state != RankState::NotRun {
                verdict.write = result.write.map(|s| s.min(255) as u8);
                verdict.read = result.read.map(|s| s.min(255) as u8);
                verdict.elapsed_ns = if done { result.elapsed_ns } else { 0 };
                verdict.push_mbps = match (&runs[i], r.push) {
                    (Run::Finished, Some(p)) if result.push_ns > 0 => {
                        (p.bytes.saturating_mul(1000) / result.push_ns).clamp(1, u32::MAX as u64) as u32
                    }
                    _ => 0,
                };
            }
            (verdict, detail)
        })
        .collect();

    // Cleanup: nothing a kernel that may still run touches is freed or waited for.
    let hung = runs.contains(&Run::Unfinished);
    for (i, stream) in streams.into_iter().enumerate() {
        match stream {
            Some(stream) if runs[i] == Run::Unfinished => std::mem::forget(stream),
            Some(stream) => drop(device::with_device(ranks[i].device, || {
                drop(stream);
                Ok(())
            })),
            None => {}
        }
    }
    if hung {
        blocks.leak();
    } else {
        drop(device::with_device(first.device, || {
            drop(blocks);
            Ok(())
        }));
    }
    verdicts
}

/// A result block's content, read with volatile loads (a kernel may write it still).
///
/// # Safety
/// `block` must point to a live, aligned `EarSelfTestResult`.
unsafe fn read_block(block: *const EarSelfTestResult) -> EarSelfTestResult {
    // SAFETY: the caller's contract; every field is plain data.
    unsafe {
        EarSelfTestResult {
            done: std::ptr::addr_of!((*block).done).read_volatile(),
            elapsed_ns: std::ptr::addr_of!((*block).elapsed_ns).read_volatile(),
            write: std::array::from_fn(|q| std::ptr::addr_of!((*block).write[q]).read_volatile()),
            read: std::array::from_fn(|q| std::ptr::addr_of!((*block).read[q]).read_volatile()),
            push_ns: std::ptr::addr_of!((*block).push_ns).read_volatile(),
        }
    }
}

/// The self-test of every rank of a group in this process: one kernel per rank in `ranks`
/// (index = rank, every rank of the group), launched on all devices at once, then [`decide`].
/// A rank missing from `ranks` counts as not run. Err names the first problem (with what the
/// host saw besides, a CUDA error, in `detail`); when
/// [`SelfTestFailure::kernels_may_still_run`], the caller must never free the workspaces.
pub(crate) fn run_in_process(
    ranks: &[RankSelfTest],
    bounds: Bounds,
    min_push_mbps: u32,
) -> std::result::Result<(), SelfTestFailure> {
    let nranks = ranks.first().map_or(0, |r| r.nranks).max(0);
    let mut verdicts: Vec<RankVerdict> = (0..nranks).map(|r| RankVerdict::not_run(r, nranks, -1)).collect();
    let mut details = Vec::new();
    for (verdict, detail) in run_ranks(ranks, bounds) {
        if let Some(detail) = detail {
            details.push(format!("rank {}: {detail}", verdict.rank));
        }
        if let Some(slot) = usize::try_from(verdict.rank).ok().and_then(|r| verdicts.get_mut(r)) {
            *slot = verdict;
        }
    }
    decide_with(&verdicts, min_push_mbps).map_err(|mut failure| {
        failure.detail = (!details.is_empty()).then(|| details.join("; "));
        failure
    })
}

/// One rank's part of the self-test when each rank is in a process of its own: its kernel, then
/// its verdict, to be gathered by every rank and given to [`decide`] in rank order. Every rank
/// must call it at about the same time (within the bound), after every rank mapped its peers'
/// workspaces. What the host saw besides (a CUDA error) is logged. An
/// [`RankState::Unfinished`] verdict: the kernel may still run (the module's documentation).
pub(crate) fn run_one_rank(rank: &RankSelfTest, bounds: Bounds) -> RankVerdict {
    let (verdict, detail) = run_ranks(std::slice::from_ref(rank), bounds)
        .pop()
        .unwrap_or_else(|| (RankVerdict::not_run(rank.rank, rank.nranks, rank.device), None));
    if let Some(detail) = detail {
        crate::log::warning(&format!("device {}: the peer self-test of rank {}: {detail}", rank.device, rank.rank));
    }
    verdict
}

/// `EAR_SELFTEST_TOKEN(src, dst, round)` (kernels/allreduce_params.h, through kernels/layout.c).
fn selftest_token(src: u32, dst: u32, round: u32) -> u64 {
    // SAFETY: pure arithmetic on the header's macro.
    unsafe { ear_selftest_token(src, dst, round) }
}

// kernels/layout.c: the header's macros as functions.
extern "C" {
    fn ear_selftest_token(src: u32, dst: u32, round: u32) -> u64;
    #[cfg(test)]
    fn ear_selftest_offset(max_msg_bytes: u64, nranks: i32) -> u64;
    #[cfg(test)]
    fn ear_selftest_params_size() -> u64;
}

#[cfg(test)]
mod tests;
