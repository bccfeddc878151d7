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

use crate::launch::contract::{
    EarSelfTestParams, EarSelfTestResult, EAR_MAX_RANKS, EAR_SELFTEST_MAGIC, EAR_SELFTEST_PASSED,
    EAR_SELFTEST_THREADS, EAR_SELFTEST_UNMAPPED, EAR_SELFTEST_WRONG,
};
use crate::cuda::{self, DevicePtr, Function, MappedHost, OwnedStream};
use crate::error::{Error, Result, SelfTestFailure, SelfTestKind, SelfTestProblem};
use crate::group::Group;
use std::time::{Duration, Instant};

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
    pub fn new(kernel: Duration) -> Bounds {
        Bounds {
            kernel,
            host: kernel.saturating_add(HOST_GRACE),
        }
    }

    /// `EDGELLM_ALLREDUCE_SELFTEST_MS`; None when it is 0 (no self-test: unsafe).
    pub fn configured() -> Option<Bounds> {
        let ms = crate::config().selftest_ms;
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
    pub inject: RankInjection,
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
            reserved: 0,
        }
    }
}

/// How one rank's kernel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankState {
    /// It ended and reported every entry.
    Finished = 1,
    /// It had not ended at the host's deadline (it stalled: a peer load that never returns).
    Unfinished = 2,
    /// It ended with a CUDA error (an access to a bad address: a broken mapping).
    Faulted = 3,
    /// No kernel ran (not launched, its launch failed), or its verdict did not arrive.
    NotRun = 4,
}

impl RankState {
    fn from_code(code: u32) -> RankState {
        match code {
            1 => RankState::Finished,
            2 => RankState::Unfinished,
            3 => RankState::Faulted,
            _ => RankState::NotRun,
        }
    }
}

/// One rank's verdict: how its kernel ended and what it saw of each peer, compact enough to be
/// gathered by every rank ([`RankVerdict::encode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankVerdict {
    pub rank: i32,
    pub nranks: i32,
    /// The rank's device (in its own process's numbering).
    pub device: i32,
    pub state: RankState,
    /// `write[q]`: how rank q's token arrived in this rank's workspace (`EAR_SELFTEST_*`).
    pub write: [u8; EAR_MAX_RANKS],
    /// `read[q]`: what this rank's loads of rank q's workspace returned (`EAR_SELFTEST_*`).
    pub read: [u8; EAR_MAX_RANKS],
    /// How long the kernel took (ns, its own clock); 0 unless finished.
    pub elapsed_ns: u64,
}

/// The size of an encoded [`RankVerdict`]: what each rank contributes to the gather.
pub const VERDICT_BYTES: usize = 64;

impl RankVerdict {
    /// The verdict of a rank that ran no kernel (or whose verdict did not arrive).
    pub fn not_run(rank: i32, nranks: i32, device: i32) -> RankVerdict {
        RankVerdict {
            rank,
            nranks,
            device,
            state: RankState::NotRun,
            write: [0; EAR_MAX_RANKS],
            read: [0; EAR_MAX_RANKS],
            elapsed_ns: 0,
        }
    }

    /// Little-endian: the magic, rank, rank count, device, state, a zero word, the time, then
    /// the write and read entries.
    pub fn encode(&self) -> [u8; VERDICT_BYTES] {
        let mut b = [0u8; VERDICT_BYTES];
        b[0..4].copy_from_slice(&EAR_SELFTEST_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.rank.to_le_bytes());
        b[8..12].copy_from_slice(&self.nranks.to_le_bytes());
        b[12..16].copy_from_slice(&self.device.to_le_bytes());
        b[16..20].copy_from_slice(&(self.state as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.elapsed_ns.to_le_bytes());
        b[32..48].copy_from_slice(&self.write);
        b[48..64].copy_from_slice(&self.read);
        b
    }

    /// Rank `rank`'s gathered verdict: [`RankState::NotRun`] (device -1) unless `bytes` is one,
    /// of that rank and rank count.
    pub fn decode(bytes: &[u8], rank: i32, nranks: i32) -> RankVerdict {
        let absent = RankVerdict::not_run(rank, nranks, -1);
        if bytes.len() != VERDICT_BYTES {
            return absent;
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let i32_at = |i: usize| u32_at(i) as i32;
        if u32_at(0) != EAR_SELFTEST_MAGIC || i32_at(4) != rank || i32_at(8) != nranks {
            return absent;
        }
        RankVerdict {
            rank,
            nranks,
            device: i32_at(12),
            state: RankState::from_code(u32_at(16)),
            write: bytes[32..48].try_into().unwrap(),
            read: bytes[48..64].try_into().unwrap(),
            elapsed_ns: u64::from_le_bytes(bytes[24..32].try_into().unwrap()),
        }
    }
}


/// The decision on every rank's verdict (index = rank), the same on every rank that runs it on
/// the same verdicts: Ok when every rank finished and every write and read between every pair
/// passed; else the first problem in [`SelfTestProblem::order`], with all the others. A verdict
/// that is not of its index's rank or of the list's rank count counts as not run. The failures
/// between two ranks are judged only when both finished (else the rank's own problem explains
/// them).
pub fn decide(verdicts: &[RankVerdict]) -> std::result::Result<(), SelfTestFailure> {
    let n = verdicts.len();
    let state = |r: usize| {
        let v = &verdicts[r];
        if v.rank == r as i32 && v.nranks == n as i32 {
            v.state
        } else {
            RankState::NotRun
        }
    };
    let mut problems = Vec::new();
    for a in 0..n {
        let kind = match state(a) {
            RankState::Finished => continue,
            RankState::Unfinished => SelfTestKind::DidNotFinish,
            RankState::Faulted => SelfTestKind::Faulted,
            RankState::NotRun => SelfTestKind::NotRun,
        };
        problems.push(SelfTestProblem {
            kind,
            a: a as i32,
            b: None,
        });
    }
    for a in (0..n).filter(|&a| state(a) == RankState::Finished) {
        for b in (0..n).filter(|&b| b != a && state(b) == RankState::Finished) {
            // NOT_SEEN, and whatever else a finished kernel should not have left (PENDING), fail.
            let write = match verdicts[b].write.get(a).map(|&s| s as u32) {
                Some(EAR_SELFTEST_PASSED) => None,
                Some(EAR_SELFTEST_WRONG) => Some(SelfTestKind::WriteWrong),
                _ => Some(SelfTestKind::WriteLost),
            };
            let read = match verdicts[a].read.get(b).map(|&s| s as u32) {
                Some(EAR_SELFTEST_PASSED) => None,
                Some(EAR_SELFTEST_WRONG) => Some(SelfTestKind::ReadWrong),
                Some(EAR_SELFTEST_UNMAPPED) => Some(SelfTestKind::MappingFailed),
                _ => Some(SelfTestKind::ReadTimedOut),
            };
            problems.extend(
                [write, read]
                    .into_iter()
                    .flatten()
                    .map(|kind| SelfTestProblem {
                        kind,
                        a: a as i32,
                        b: Some(b as i32),
                    }),
            );
        }
    }
    problems.sort_by_key(SelfTestProblem::order);
    let mut problems = problems.into_iter();
    let Some(first) = problems.next() else {
        return Ok(());
    };
    let device = |r: i32| {
        let v = verdicts.get(usize::try_from(r).ok()?)?;
        (v.device >= 0 && v.state != RankState::NotRun).then_some(v.device)
    };
    Err(SelfTestFailure {
        kind: first.kind,
        a: first.a,
        b: first.b,
        device_a: device(first.a),
        device_b: first.b.and_then(device),
        others: problems.collect(),
        detail: None,
    })
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
        ranks
            .iter()
            .map(|r| {
                (
                    RankVerdict::not_run(r.rank, r.nranks, r.device),
                    Some(why.clone()),
                )
            })
            .collect()
    };
    // One result block per rank, in memory every device writes and the host reads as it goes.
    let bytes = std::mem::size_of::<EarSelfTestResult>() * ranks.len();
    let blocks = match cuda::with_device(first.device, || MappedHost::zeroed(bytes)) {
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
        let launched = cuda::with_device(r.device, || {
            let stream = OwnedStream::non_blocking()?;
            // SAFETY: the kernel's own parameter block: the workspaces are the group's (alive
            // while the caller holds it, and never freed if this kernel does not finish), the
            // result block is ours (leaked if it does not finish); grid 1, its block size.
            unsafe {
                cuda::launch(
                    r.function,
                    1,
                    EAR_SELFTEST_THREADS,
                    stream.stream(),
                    &params,
                    false,
                )
            }?;
            Ok(stream)
        });
        match launched {
            Ok(stream) => {
                streams.push(Some(stream));
                runs.push(Run::Running);
            }
            Err(e) => {
                streams.push(None);
                runs.push(Run::Absent(Some(format!(
                    "launching its kernel on device {}: {e}",
                    r.device
                ))));
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
            match cuda::with_device(ranks[i].device, || stream.finished()) {
                Ok(true) => *run = Run::Finished,
                Ok(false) => pending = true,
                Err(e) => {
                    *run = Run::Faulted(format!(
                        "its kernel on device {} failed: {e}",
                        ranks[i].device
                    ))
                }
            }
        }
        if !pending {
            break;
        }
        if Instant::now() >= deadline {
            runs.iter_mut()
                .filter(|run| **run == Run::Running)
                .for_each(|run| *run = Run::Unfinished);
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
                Run::Finished => (
                    RankState::Faulted,
                    Some(format!(
                        "its kernel on device {} ended without its verdict",
                        r.device
                    )),
                ),
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
            }
            (verdict, detail)
        })
        .collect();

    // Cleanup: nothing a kernel that may still run touches is freed or waited for.
    let hung = runs.contains(&Run::Unfinished);
    for (i, stream) in streams.into_iter().enumerate() {
        match stream {
            Some(stream) if runs[i] == Run::Unfinished => std::mem::forget(stream),
            Some(stream) => drop(cuda::with_device(ranks[i].device, || {
                drop(stream);
                Ok(())
            })),
            None => {}
        }
    }
    if hung {
        blocks.leak();
    } else {
        drop(cuda::with_device(first.device, || {
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
) -> std::result::Result<(), SelfTestFailure> {
    let nranks = ranks.first().map_or(0, |r| r.nranks).max(0);
    let mut verdicts: Vec<RankVerdict> = (0..nranks)
        .map(|r| RankVerdict::not_run(r, nranks, -1))
        .collect();
    let mut details = Vec::new();
    for (verdict, detail) in run_ranks(ranks, bounds) {
        if let Some(detail) = detail {
            details.push(format!("rank {}: {detail}", verdict.rank));
        }
        if let Some(slot) = usize::try_from(verdict.rank)
            .ok()
            .and_then(|r| verdicts.get_mut(r))
        {
            *slot = verdict;
        }
    }
    decide(&verdicts).map_err(|mut failure| {
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
        .unwrap_or_else(|| {
            (
                RankVerdict::not_run(rank.rank, rank.nranks, rank.device),
                None,
            )
        });
    if let Some(detail) = detail {
        crate::log::warning(&format!(
            "device {}: the peer self-test of rank {}: {detail}",
            rank.device, rank.rank
        ));
    }
    verdict
}

/// Fault injection for [`Group::self_test`] (tests only; `Default`: none, the configured bound).
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct SelfTestInjection {
    /// `(from, to)`: rank `from` does not write its token into rank `to`'s workspace.
    pub drop_writes: Vec<(i32, i32)>,
    /// `(from, to)`: rank `from` writes a wrong token into rank `to`'s workspace.
    pub garble_writes: Vec<(i32, i32)>,
    /// Ranks that write a wrong token into their own slot (every peer reads a wrong value).
    pub garble_own_slot: Vec<i32>,
    /// Ranks whose kernel is never launched.
    pub not_launched: Vec<i32>,
    /// The kernels' bound instead of `EDGELLM_ALLREDUCE_SELFTEST_MS`.
    pub bound: Option<Duration>,
    /// How long the host waits for the kernels in all (from before the first launch) instead of
    /// the bound plus [`HOST_GRACE`]: longer under compute-sanitizer, which is slow to start
    /// kernels; shorter than the bound to see how a kernel that does not finish is handled.
    pub host_wait: Option<Duration>,
}

impl SelfTestInjection {
    fn for_rank(&self, rank: i32) -> RankInjection {
        let mask = |pairs: &[(i32, i32)]| {
            pairs
                .iter()
                .filter(|&&(from, _)| from == rank)
                .fold(0u32, |m, &(_, to)| {
                    m | 1u32.checked_shl(to as u32).unwrap_or(0)
                })
        };
        let own = if self.garble_own_slot.contains(&rank) {
            1u32.checked_shl(rank as u32).unwrap_or(0)
        } else {
            0
        };
        RankInjection {
            skip_mask: mask(&self.drop_writes),
            garble_mask: mask(&self.garble_writes) | own,
            not_launched: self.not_launched.contains(&rank),
        }
    }

    /// The bounds to run with; None: the configured bound is 0 (no self-test).
    fn bounds(&self) -> Option<Bounds> {
        let bounds = self.bound.map(Bounds::new).or_else(Bounds::configured)?;
        Some(Bounds {
            host: self.host_wait.unwrap_or(bounds.host),
            ..bounds
        })
    }
}

impl Group {
    /// Rank `rank`'s part of self-test round `round` (this process must drive the rank): its
    /// device, its kernel, the workspaces as this process maps them (NULL where a mapping
    /// failed). For a group formed by the exchange: `round` 1, the same on every rank.
    pub(crate) fn self_test_rank(
        &self,
        rank: i32,
        round: u32,
        inject: RankInjection,
    ) -> Result<RankSelfTest> {
        let member = self.member(rank)?;
        let function = member
            .kernels
            .selftest()
            .ok_or_else(|| Error::NoKernel(crate::launch::kernels::SELFTEST_KERNEL.to_owned()))?;
        Ok(RankSelfTest {
            rank,
            nranks: self.nranks,
            device: member.device,
            function,
            peer_ws: self.peer_ws,
            max_bytes: self.max_bytes,
            round,
            inject,
        })
    }

    /// Every rank's part of a new self-test round of this group, whose ranks must all be in
    /// this process (an in-process or simulated group).
    fn self_test_ranks(&self, inject: &SelfTestInjection) -> Result<Vec<RankSelfTest>> {
        let round = self.next_self_test_round();
        (0..self.nranks)
            .map(|rank| self.self_test_rank(rank, round, inject.for_rank(rank)))
            .collect()
    }

    /// Runs the peer self-test on every rank of this group (all in this process: an in-process
    /// or simulated group): one kernel per rank, all at once, each on a new stream of its device,
    /// bounded by `EDGELLM_ALLREDUCE_SELFTEST_MS` (Ok at once when it is 0) or `inject.bound`.
    /// [`Error::SelfTest`] names the first problem. A group whose test left a kernel running is
    /// retired and never freed.
    pub fn self_test(&self, inject: &SelfTestInjection) -> Result<()> {
        let Some(bounds) = inject.bounds() else {
            return Ok(());
        };
        let ranks = self.self_test_ranks(inject)?;
        run_in_process(&ranks, bounds).map_err(|failure| {
            if failure.kernels_may_still_run() {
                self.wedge();
            }
            Error::SelfTest(Box::new(failure))
        })
    }

    /// The self-test as ranks in processes of their own run it (tests): each rank's
    /// [`run_one_rank`] on a thread of its own, all at once; then the "gather": every verdict
    /// encoded and decoded, a rank that was not launched contributing nothing (it decodes as
    /// not run). Returns the verdicts in rank order, for [`decide`].
    #[doc(hidden)]
    pub fn self_test_each_rank(&self, inject: &SelfTestInjection) -> Result<Vec<RankVerdict>> {
        let bounds = inject.bounds().unwrap_or(Bounds::new(Duration::from_millis(
            crate::config::DEFAULT_SELFTEST_MS,
        )));
        let ranks = self.self_test_ranks(inject)?;
        let gathered: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let threads: Vec<_> = ranks
                .iter()
                .map(|rank| {
                    scope.spawn(move || {
                        if rank.inject.not_launched {
                            Vec::new()
                        } else {
                            run_one_rank(rank, bounds).encode().to_vec()
                        }
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap_or_default())
                .collect()
        });
        let verdicts: Vec<RankVerdict> = gathered
            .iter()
            .zip(0..)
            .map(|(bytes, rank)| RankVerdict::decode(bytes, rank, self.nranks))
            .collect();
        if verdicts.iter().any(|v| v.state == RankState::Unfinished) {
            self.wedge();
        }
        Ok(verdicts)
    }
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
mod tests {
    use super::*;
    use crate::launch::contract::{EAR_SELFTEST_NOT_SEEN, EAR_SELFTEST_PENDING};

    const PASSED: u8 = EAR_SELFTEST_PASSED as u8;
    const NOT_SEEN: u8 = EAR_SELFTEST_NOT_SEEN as u8;
    const WRONG: u8 = EAR_SELFTEST_WRONG as u8;

    /// The verdicts of a healthy group of `n` ranks, rank r on device 10 + r.
    fn healthy(n: usize) -> Vec<RankVerdict> {
        (0..n)
            .map(|r| {
                let mut v = RankVerdict::not_run(r as i32, n as i32, 10 + r as i32);
                v.state = RankState::Finished;
                for q in (0..n).filter(|&q| q != r) {
                    (v.write[q], v.read[q]) = (PASSED, PASSED);
                }
                v.elapsed_ns = 3_000;
                v
            })
            .collect()
    }

    /// `verdicts` as they arrive after a gather: each encoded, then decoded as its rank's.
    fn gathered(verdicts: &[RankVerdict]) -> Vec<RankVerdict> {
        let n = verdicts.len() as i32;
        verdicts
            .iter()
            .zip(0..)
            .map(|(v, r)| RankVerdict::decode(&v.encode(), r, n))
            .collect()
    }

    #[test]
    fn a_healthy_group_passes_at_every_rank_count() {
        for n in [1, 2, 4, 6, 8, 16] {
            assert_eq!(decide(&gathered(&healthy(n))), Ok(()), "{n} ranks");
        }
        assert_eq!(decide(&[]), Ok(()), "no ranks, no pairs");
    }

    #[test]
    fn a_lost_write_names_its_pair_and_devices() {
        let mut v = healthy(4);
        v[2].write[1] = NOT_SEEN; // rank 1's token never arrived in rank 2's workspace
        let f = decide(&gathered(&v)).unwrap_err();
        assert_eq!(
            (f.kind, f.a, f.b, f.device_a, f.device_b),
            (SelfTestKind::WriteLost, 1, Some(2), Some(11), Some(12))
        );
        assert!(f.others.is_empty(), "{:?}", f.others);
        assert!(!f.kernels_may_still_run());
        let text = Error::SelfTest(Box::new(f)).to_string();
        for says in [
            "rank 1 -> rank 2 (device 11 -> device 12)",
            "write lost",
            "ACS",
            "iommu=pt",
            "NCCL_P2P_DISABLE=1",
            "EDGELLM_ALLREDUCE_STRATEGY=nccl",
        ] {
            assert!(text.contains(says), "{text:?} should say {says:?}");
        }
        // A pending entry of a finished kernel (never written) is no pass either.
        v[2].write[1] = EAR_SELFTEST_PENDING as u8;
        assert_eq!(decide(&v).unwrap_err().kind, SelfTestKind::WriteLost);
    }

    #[test]
    fn wrong_values_and_timed_out_reads_are_told_apart() {
        let mut v = healthy(2);
        v[0].read[1] = WRONG;
        let f = decide(&v).unwrap_err();
        assert_eq!((f.kind, f.a, f.b), (SelfTestKind::ReadWrong, 0, Some(1)));
        assert!(
            f.to_string().contains("(device 10 reading device 11)"),
            "{f}"
        );
        v[0].read[1] = NOT_SEEN;
        assert_eq!(decide(&v).unwrap_err().kind, SelfTestKind::ReadTimedOut);
        let mut v = healthy(2);
        v[0].write[1] = WRONG;
        assert_eq!(
            decide(&v).unwrap_err().problem(),
            SelfTestProblem {
                kind: SelfTestKind::WriteWrong,
                a: 1,
                b: Some(0)
            }
        );
        let mut v = healthy(2);
        v[1].read[0] = EAR_SELFTEST_UNMAPPED as u8;
        v[0].write[1] = NOT_SEEN; // rank 1 had no mapping of rank 0's workspace: nothing written either
        let f = decide(&v).unwrap_err();
        assert_eq!(
            (f.kind, f.a, f.b),
            (SelfTestKind::MappingFailed, 1, Some(0)),
            "the mapping explains the lost write"
        );
        assert_eq!(
            f.others,
            [SelfTestProblem {
                kind: SelfTestKind::WriteLost,
                a: 1,
                b: Some(0)
            }]
        );
    }

    #[test]
    fn a_rank_that_never_ran_is_named_not_the_timeouts_it_caused() {
        let mut v = healthy(4);
        // Rank 2 never launched: every peer timed out on it, and it has no verdict.
        for r in [0, 1, 3] {
            (v[r].write[2], v[r].read[2]) = (NOT_SEEN, NOT_SEEN);
        }
        let mut bytes: Vec<Vec<u8>> = v.iter().map(|v| v.encode().to_vec()).collect();
        bytes[2] = Vec::new(); // nothing gathered from it
        let verdicts: Vec<RankVerdict> = bytes
            .iter()
            .zip(0..)
            .map(|(b, r)| RankVerdict::decode(b, r, 4))
            .collect();
        assert_eq!(verdicts[2], RankVerdict::not_run(2, 4, -1));
        let f = decide(&verdicts).unwrap_err();
        assert_eq!(
            (f.kind, f.a, f.b, f.device_a),
            (SelfTestKind::NotRun, 2, None, None)
        );
        assert!(
            f.others.is_empty(),
            "the peers' timeouts are explained by the missing rank: {:?}",
            f.others
        );
        let text = f.to_string();
        assert!(
            text.contains("rank 2 (device ?) ran no self-test kernel")
                && text.contains("not a fault of the links"),
            "{text}"
        );
        // Launched but its launch failed: the same, with the device known.
        v[2] = RankVerdict::not_run(2, 4, 12);
        assert_eq!(
            decide(&v).unwrap_err().problem(),
            SelfTestProblem {
                kind: SelfTestKind::NotRun,
                a: 2,
                b: None
            }
        );
    }

    #[test]
    fn a_kernel_that_did_not_finish_says_its_memory_must_stay() {
        let mut v = healthy(2);
        v[1].state = RankState::Unfinished;
        let f = decide(&gathered(&v)).unwrap_err();
        assert_eq!(
            (f.kind, f.a, f.device_a),
            (SelfTestKind::DidNotFinish, 1, Some(11))
        );
        assert!(f.kernels_may_still_run());
        assert!(f.to_string().contains("never freed"), "{f}");
        // Also when another problem comes first.
        v[0] = RankVerdict::not_run(0, 2, 10);
        let f = decide(&v).unwrap_err();
        assert_eq!((f.kind, f.a), (SelfTestKind::NotRun, 0));
        assert!(f.kernels_may_still_run(), "{:?}", f.others);
        let mut v = healthy(2);
        v[0].state = RankState::Faulted;
        assert_eq!(decide(&v).unwrap_err().kind, SelfTestKind::Faulted);
    }

    #[test]
    fn the_pair_reported_is_the_lowest_whatever_the_order_found() {
        let mut v = healthy(8);
        v[1].write[6] = NOT_SEEN; // 6 -> 1
        v[3].read[5] = WRONG; // 3 -> 5
        v[7].write[3] = WRONG; // 3 -> 7
        v[4].write[0] = NOT_SEEN; // 0 -> 4
        let f = decide(&gathered(&v)).unwrap_err();
        assert_eq!((f.kind, f.a, f.b), (SelfTestKind::WriteLost, 0, Some(4)));
        let others: Vec<(i32, Option<i32>)> = f.others.iter().map(|p| (p.a, p.b)).collect();
        assert_eq!(others, [(3, Some(5)), (3, Some(7)), (6, Some(1))]);
        assert!(
            f.to_string()
                .contains("(and 3 more: read wrong 3 -> 5, write wrong 3 -> 7, write lost 6 -> 1)"),
            "{f}"
        );
        // Every rank decides on the same gathered verdicts: the same failure everywhere.
        for _rank in 0..8 {
            assert_eq!(decide(&gathered(&v)).unwrap_err(), f);
        }
    }

    #[test]
    fn verdicts_round_trip_and_anything_else_is_not_run() {
        let mut v = healthy(4)[3];
        v.write[1] = NOT_SEEN;
        v.elapsed_ns = u64::MAX - 5;
        assert_eq!(RankVerdict::decode(&v.encode(), 3, 4), v);
        assert_eq!(v.encode().len(), VERDICT_BYTES);
        let absent = RankVerdict::not_run(3, 4, -1);
        assert_eq!(
            RankVerdict::decode(&v.encode(), 2, 4),
            absent.with_rank(2),
            "another rank's verdict at this index"
        );
        assert_eq!(
            RankVerdict::decode(&v.encode(), 3, 8),
            RankVerdict::not_run(3, 8, -1),
            "another rank count"
        );
        assert_eq!(
            RankVerdict::decode(&[0u8; VERDICT_BYTES], 3, 4),
            absent,
            "zeros: no magic"
        );
        assert_eq!(
            RankVerdict::decode(&v.encode()[..63], 3, 4),
            absent,
            "short"
        );
        let mut odd = v.encode();
        odd[16] = 99;
        assert_eq!(
            RankVerdict::decode(&odd, 3, 4).state,
            RankState::NotRun,
            "an unknown state"
        );
        // A verdict placed at another index than its rank counts as not run.
        let mut list = healthy(2);
        list.swap(0, 1);
        assert_eq!(decide(&list).unwrap_err().kind, SelfTestKind::NotRun);
    }

    #[test]
    fn injections_become_the_ranks_masks() {
        let inject = SelfTestInjection {
            drop_writes: vec![(1, 2), (1, 0), (3, 1)],
            garble_writes: vec![(1, 3)],
            garble_own_slot: vec![1],
            not_launched: vec![2],
            ..Default::default()
        };
        assert_eq!(
            inject.for_rank(1),
            RankInjection {
                skip_mask: 0b101,
                garble_mask: 0b1010,
                not_launched: false
            }
        );
        assert_eq!(
            inject.for_rank(2),
            RankInjection {
                not_launched: true,
                ..Default::default()
            }
        );
        assert_eq!(inject.for_rank(0), RankInjection::default());
        let ms = Duration::from_millis;
        let bounds = SelfTestInjection {
            bound: Some(ms(7)),
            ..Default::default()
        }
        .bounds()
        .unwrap();
        assert_eq!(
            bounds,
            Bounds {
                kernel: ms(7),
                host: ms(7) + HOST_GRACE
            }
        );
        let slow = SelfTestInjection {
            bound: Some(ms(7)),
            host_wait: Some(ms(60_000)),
            ..Default::default()
        }
        .bounds()
        .unwrap();
        assert_eq!(
            slow,
            Bounds {
                kernel: ms(7),
                host: ms(60_000)
            }
        );
    }

    #[test]
    fn the_bound_is_short_and_the_host_waits_a_little_longer() {
        // The default bound (Bounds::configured reads the environment's, if any).
        let b = Bounds::new(Duration::from_millis(crate::config::DEFAULT_SELFTEST_MS));
        assert_eq!(b.kernel, Duration::from_millis(50));
        assert!(
            b.host > b.kernel && b.host < Duration::from_secs(2),
            "{b:?}"
        );
        assert_eq!(b.kernel_ns(), 50_000_000);
        assert_eq!(
            Bounds::new(Duration::MAX).kernel_ns(),
            1 << 62,
            "the kernel's deadline never wraps"
        );
    }

    #[test]
    fn the_area_follows_every_other_region_and_tokens_are_never_zero() {
        // SAFETY: pure arithmetic and constants of kernels/layout.c.
        unsafe {
            assert_eq!(
                ear_selftest_params_size(),
                std::mem::size_of::<EarSelfTestParams>() as u64
            );
            for (m, n) in [(1u64 << 20, 2), (16_000_000, 2), (8_000_000, 8), (1000, 16)] {
                let area = ear_selftest_offset(m, n);
                assert_eq!(
                    crate::launch::family::workspace_bytes(m, n),
                    area + 384,
                    "m={m} n={n}: the area ends the workspace"
                );
                assert_eq!(area % 128, 0);
            }
        }
        assert_eq!(selftest_token(1, 2, 3), 0x5E1F_7E57_0003_0102);
        assert_eq!(
            selftest_token(0, 0, 0x1_0000),
            0x5E1F_7E57_0000_0000,
            "16 bits of the round; never zero"
        );
        assert_ne!(selftest_token(2, 1, 3), selftest_token(1, 2, 3));
    }

    impl RankVerdict {
        fn with_rank(mut self, rank: i32) -> RankVerdict {
            self.rank = rank;
            self
        }
    }
}
