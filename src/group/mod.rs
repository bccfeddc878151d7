//! Devices and groups. A group is the ranks of one communicator that this process drives with
//! the custom kernels: per rank a workspace (staging buffers and barrier slots that peers read
//! and write, and the abort word) and a local state block (call counters that only the kernels
//! advance: CUDA-graph safe), allocated once and zero-filled; sizes follow
//! `kernels/allreduce_params.h` ([`family::workspace_bytes`]).
//!
//! | file | owns |
//! |---|---|
//! | [`device`] | the one record per device: kernels, registration, group (or its failure) |
//! | [`formation`] | which devices form a group, at registration; [`exchange`]: across processes |
//! | `mod.rs` (here) | one group's memory, generation, retirement, the stream that owns a rank |
//! | [`run`] | one call: plan and launch |
//! | [`fault`] | the kernels' fault words, read without synchronizing |
//! | [`reclaim`] | memory of released groups, freed at setup and teardown |
//!
//! Lifetime: a group has a generation (its faults name it). Released, it is retired (its abort
//! words set, after its devices finished their work: a CUDA graph that still replays its kernels
//! finds them aborted and records a fault). Its memory is freed only once the last reference
//! goes, and CUDA graphs that captured its kernels hold references (`cuda::tie_to_capture`);
//! even then it is only handed to [`reclaim`], which frees it at the runtime's next setup or
//! teardown call. [`Group::simulated`] puts N ranks on one device for tests and benchmarks.

pub(crate) mod device;
pub(crate) mod exchange;
pub(crate) mod fault;
pub(crate) mod formation;
pub(crate) mod reclaim;
pub(crate) mod run;
pub(crate) mod selftest;

use crate::contract::{EAR_FAULT_RELEASED, EAR_MAX_RANKS};
use crate::cuda::{self, DeviceBuffer, DevicePtr, IpcMapping, Stream};
use crate::error::{Error, Result};
use crate::launch::family::{self, RANK_COUNTS};
use crate::launch::kernels::DeviceKernels;
use crate::link::LinkClass;
use fault::Fault;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// The largest message the custom kernels take for a communicator of `nranks`
/// (`crate::config`: `EDGELLM_ALLREDUCE_WORKSPACE_BYTES`, else the seed's rule).
pub fn max_message_bytes(nranks: i32) -> u64 {
    crate::config::get().max_message_bytes(nranks)
}

/// The grid cap (`crate::config`: `EDGELLM_ALLREDUCE_MAX_BLOCKS`, else the kernels' maximum),
/// never more than the SM count of a rank's GPU (all CTAs must be co-resident). On 2 x H200, 128
/// against 64 took the two-shot from 241 to 214 us at 64 MiB and Lamport from 6.5 to 5.7 us at
/// 1 MiB (docs/PERFORMANCE.md).
fn max_blocks(sms: u32) -> u32 {
    crate::config::get().max_blocks().min(sms.max(1))
}

/// The grid cap of a rank on `device`.
pub(crate) fn device_max_blocks(device: i32) -> Result<u32> {
    Ok(max_blocks(device::kernels(device)?.sm_count.max(1) as u32))
}

/// `Member::stream` before a stream claimed the rank.
const NO_STREAM: usize = usize::MAX;

/// One rank's memory on its device.
pub(crate) struct Member {
    pub device: i32,
    pub workspace: DeviceBuffer,
    pub state: DeviceBuffer,
    pub kernels: Arc<DeviceKernels>,
    /// The device's fault word (`crate::group::fault`).
    pub fault: fault::FaultWord,
    /// The stream that runs this rank's custom all-reduces: the first that ran one.
    stream: AtomicUsize,
}

impl Member {
    /// One rank's workspace and state block on `device` (whose context is current).
    pub(crate) fn allocate(device: i32, max_bytes: u64, nranks: i32) -> Result<Member> {
        let kernels = device::kernels(device)?;
        kernels.require_all()?;
        let fault = device::fault_word(device)?;
        let workspace = DeviceBuffer::zeroed(family::workspace_bytes(max_bytes, nranks) as usize)?;
        let state = DeviceBuffer::zeroed(family::state_bytes())?;
        Ok(Member { device, workspace, state, kernels, fault, stream: AtomicUsize::new(NO_STREAM) })
    }

    /// The workspace's abort word (`kernels/allreduce_params.h`).
    fn abort_word(&self) -> DevicePtr {
        self.workspace.ptr().offset(family::abort_offset())
    }
}

/// The ranks of one communicator that this process can drive with the custom kernels.
pub struct Group {
    pub nranks: i32,
    /// Largest message (bytes) the workspaces hold.
    pub max_bytes: u64,
    /// Grid cap: identical for every rank (the launch rule).
    pub max_blocks: u32,
    /// Longest a kernel waits for a peer, in ns (0: no bound); `EDGELLM_ALLREDUCE_TIMEOUT_MS`.
    pub timeout_ns: u64,
    /// Unique in the process: a fault word names the group it came from.
    pub generation: u32,
    /// Released: launches are refused, the workspaces' abort words are set.
    retired: AtomicBool,
    /// A kernel of its peer self-test did not finish and may still touch its memory: the group
    /// is retired without waiting for its devices, and its memory is never freed
    /// (`crate::group::selftest`).
    wedged: AtomicBool,
    /// Peer self-test rounds run on its workspaces (each round's tokens are its own).
    self_test_rounds: AtomicU32,
    /// Indexed by rank: the ranks this process drives (all of them in-process, one after an
    /// IPC exchange).
    pub(crate) members: Vec<Option<Member>>,
    /// Peers' workspaces mapped from other processes, with the device of the mapping.
    pub(crate) imported: Vec<(i32, IpcMapping)>,
    /// Every rank's workspace as this process addresses it.
    pub(crate) peer_ws: [DevicePtr; EAR_MAX_RANKS],
    /// Every rank's kernels can exchange 16 bytes atomically in every peer's memory (one
    /// device, or links that do it natively: [`cuda::p2p_exchange_128`]), as the pointer exchange
    /// of inputs read in place needs (`crate::launch`).
    pub(crate) links_exchange: bool,
    /// The class of the links between its devices when they are not all one device
    /// (`Fits::link_class`): AUTO's tables follow it. NVLink until group formation measures it
    /// (`crate::link::pair_facts`, issue 29).
    pub(crate) links: LinkClass,
    /// Whether families that load from their peers may run on the group
    /// (`crate::launch::strategy::pulls_enabled` for its links, and no pair's peer reads
    /// reported unsupported): its self-test then probes peer loads too, and only then.
    pub(crate) pulls: bool,
}

impl Group {
    /// Allocates one workspace per rank, rank `r` on `devices[r]`.
    fn allocate(devices: &[i32], max_bytes: u64, max_blocks: u32) -> Result<Group> {
        reclaim::free_released_memory();
        let nranks = devices.len() as i32;
        let mut group = Group::empty(nranks, max_bytes, max_blocks)?;
        for (rank, &device) in devices.iter().enumerate() {
            let member = device::with_device(device, || Member::allocate(device, max_bytes, nranks))?;
            group.peer_ws[rank] = member.workspace.ptr();
            group.members[rank] = Some(member);
        }
        Ok(group)
    }

    /// A group of `nranks` with no memory yet (the exchange fills it in).
    pub(crate) fn empty(nranks: i32, max_bytes: u64, max_blocks: u32) -> Result<Group> {
        if !RANK_COUNTS.contains(&nranks) {
            return Err(Error::RankCount { nranks, supported: &RANK_COUNTS });
        }
        static GENERATIONS: AtomicU32 = AtomicU32::new(0);
        let members = (0..nranks).map(|_| None).collect();
        Ok(Group {
            nranks,
            max_bytes,
            max_blocks,
            timeout_ns: crate::config::get().timeout_ns(),
            generation: GENERATIONS.fetch_add(1, Ordering::Relaxed) + 1,
            retired: AtomicBool::new(false),
            wedged: AtomicBool::new(false),
            self_test_rounds: AtomicU32::new(0),
            members,
            imported: Vec::new(),
            peer_ws: [DevicePtr::NULL; EAR_MAX_RANKS],
            links_exchange: false,
            links: LinkClass::NvLink,
            pulls: true,
        })
    }

    /// The ranks of one communicator on distinct devices of this process, with peer access.
    pub fn in_process(devices: &[i32], max_bytes: u64) -> Result<Group> {
        for (i, &a) in devices.iter().enumerate() {
            for &b in &devices[i + 1..] {
                if a == b {
                    return Err(Error::SharedDevice(a));
                }
                let (ca, cb) = (device::context(a)?, device::context(b)?);
                if !cuda::enable_peer_access(a, ca, b, cb)? || !cuda::enable_peer_access(b, cb, a, ca)? {
                    return Err(Error::NoPeerAccess(a, b));
                }
            }
        }
        let max_blocks = devices.iter().map(|&d| device_max_blocks(d)).collect::<Result<Vec<_>>>()?;
        let mut group = Self::allocate(devices, max_bytes, max_blocks.into_iter().min().unwrap_or(1))?;
        group.links_exchange = every_ordered_pair(devices, cuda::p2p_exchange_128);
        let facts = crate::link::pair_facts(devices, crate::link::query);
        group.links = crate::link::group_class(&facts);
        group.pulls = crate::link::reads_supported(&facts)
            && crate::launch::strategy::pulls_enabled(group.links, group.nranks, crate::launch::tuning::active());
        crate::log::info(&format!("devices {devices:?}: {}", crate::link::describe(&facts)));
        // No custom kernel runs before every link carried the self-test's stores and loads.
        group.self_test(&selftest::SelfTestInjection::configured())?; // faults: the test hook's alone
        Ok(group)
    }

    /// `nranks` simulated ranks on one device, for tests and benchmarks. Each rank's grid is
    /// capped at SMs / nranks so that all ranks' CTAs are co-resident (they spin on each other).
    pub fn simulated(device: i32, nranks: i32, max_bytes: u64) -> Result<Group> {
        let sms = device::kernels(device)?.sm_count as u32;
        let max_blocks = max_blocks((sms / nranks.max(1) as u32).max(1));
        let mut group = Self::allocate(&vec![device; nranks.max(0) as usize], max_bytes, max_blocks)?;
        group.links_exchange = true; // one device: its own memory's atomics
        Ok(group)
    }

    /// The memory of rank `rank`, if this process drives it.
    pub(crate) fn member(&self, rank: i32) -> Result<&Member> {
        self.members.get(rank as usize).and_then(Option::as_ref).ok_or(Error::RankNotLocal(rank))
    }

    /// The kernels of any rank this process drives (every rank's device loads the same set).
    pub(crate) fn kernels(&self) -> Option<&DeviceKernels> {
        self.members.iter().flatten().next().map(|m| &*m.kernels)
    }

    /// A fault a kernel of this group recorded on one of this process's ranks (a plain load of
    /// host memory: no synchronization). A group with a fault is dead on every rank.
    pub fn fault(&self) -> Option<Fault> {
        self.members
            .iter()
            .flatten()
            .find_map(|m| m.fault.read().filter(|r| r.generation == self.generation))
            .map(|r| r.fault)
    }

    /// Whether [`Group::retire`] ran.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Takes the group out of service (release, unregistration): launches are refused from now
    /// on, and once each of this process's ranks' devices finished its work, its abort word is
    /// set, so that a kernel of the group that still runs (a CUDA graph captured before,
    /// replayed) does nothing and records [`Fault::Released`]. Setup and teardown only (it
    /// synchronizes); the memory stays until the last reference goes.
    pub fn retire(&self) {
        if self.retired.swap(true, Ordering::AcqRel) {
            return;
        }
        for m in self.members.iter().flatten() {
            if let Err(e) = device::with_device(m.device, || {
                cuda::synchronize().and_then(|()| cuda::write_word(m.abort_word(), EAR_FAULT_RELEASED))
            }) {
                crate::log::warning(&format!("device {}: retiring a released group: {e}", m.device));
            }
        }
    }

    /// After a launch on `stream`: if it is capturing a CUDA graph, the graph holds a reference
    /// to the group from now on, so the group's memory outlives every replay (and a replay after
    /// [`Group::retire`] finds the group aborted). Returns whether it was capturing. A failure
    /// must fail the launch: the graph must not keep a kernel whose memory it cannot keep.
    pub fn hold_for_capture(self: &Arc<Self>, stream: Stream) -> Result<bool> {
        cuda::tie_to_capture(stream, self.clone())
    }

    /// The round of a new peer self-test of this group's workspaces (1, 2, ...).
    pub(crate) fn next_self_test_round(&self) -> u32 {
        self.self_test_rounds.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    /// A kernel of this group's peer self-test did not finish and may still touch its memory:
    /// the group takes no more launches, [`Group::retire`] waits for nothing (it would wait for
    /// ever), and its memory is never freed (freeing waits for the device).
    pub(crate) fn wedge(&self) {
        self.wedged.store(true, Ordering::Release);
        self.retired.store(true, Ordering::Release);
    }

    /// Whether rank `rank` may run a custom all-reduce on `stream`: the first stream that asks
    /// owns the rank for the life of the group (one state block and set of banks per rank,
    /// used by one stream at a time: two streams would interleave their call counters).
    pub(crate) fn claim_stream(&self, rank: i32, stream: Stream) -> bool {
        self.member(rank).is_ok_and(|m| claim(&m.stream, stream))
    }
}

/// Whether `holds(a, b)` for every ordered pair of distinct `devices` (each rank writes into
/// every peer's memory).
fn every_ordered_pair(devices: &[i32], holds: impl Fn(i32, i32) -> bool) -> bool {
    devices.iter().all(|&a| devices.iter().filter(|&&b| b != a).all(|&b| holds(a, b)))
}

/// `owner` (a rank's stream) is `stream`, or becomes it if no stream owned it yet.
fn claim(owner: &AtomicUsize, stream: Stream) -> bool {
    match owner.compare_exchange(NO_STREAM, stream.0, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => true,
        Err(current) => current == stream.0,
    }
}

impl Drop for Group {
    /// The last Arc is gone: no enqueue and no CUDA graph can launch on these buffers again.
    /// Nothing is freed here (this may be an enqueue thread or the driver's graph callback):
    /// the memory goes to `crate::group::reclaim`.
    fn drop(&mut self) {
        if self.wedged.load(Ordering::Acquire) {
            // A self-test kernel may still touch this memory: it is never freed.
            crate::log::warning(&format!("a custom all-reduce group (generation {}) whose peer self-test did not finish is dropped: its memory is leaked", self.generation));
            self.imported.drain(..).for_each(std::mem::forget);
            self.members.drain(..).flatten().for_each(std::mem::forget);
            return;
        }
        for (device, mapping) in self.imported.drain(..) {
            reclaim::defer(device, mapping);
        }
        for member in self.members.drain(..).flatten() {
            reclaim::defer(member.device, (member.workspace, member.state));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_size_rule() {
        assert_eq!(max_message_bytes(2), 16_000_000);
        assert_eq!(max_message_bytes(8), 8_000_000);
    }

    #[test]
    fn only_rank_counts_with_kernels_form_groups() {
        assert!(matches!(Group::empty(3, 1 << 20, 1), Err(Error::RankCount { nranks: 3, .. })));
        let g = Group::empty(2, 1 << 20, 1).unwrap();
        assert!(matches!(g.member(0), Err(Error::RankNotLocal(0))), "an empty group drives no rank");
        assert!(g.kernels().is_none());
        assert!(!g.claim_stream(0, Stream(7)), "no stream claims a rank this process does not drive");
    }

    #[test]
    fn the_pointer_exchange_needs_every_link_in_both_directions() {
        assert!(every_ordered_pair(&[0, 1, 2, 3], |_, _| true));
        assert!(
            !every_ordered_pair(&[0, 1, 2, 3], |a, b| !(a == 3 && b == 0)),
            "one direction of one link is enough to say no"
        );
        let asked = std::cell::RefCell::new(Vec::new());
        every_ordered_pair(&[0, 1], |a, b| {
            asked.borrow_mut().push((a, b));
            true
        });
        assert_eq!(*asked.borrow(), [(0, 1), (1, 0)], "never a device with itself (the driver rejects that)");
    }

    #[test]
    fn the_first_stream_owns_a_rank_even_when_two_race() {
        let owner = AtomicUsize::new(NO_STREAM);
        assert!(claim(&owner, Stream(0)), "the legacy default stream (0) is a stream like any other");
        assert!(claim(&owner, Stream(0)));
        assert!(!claim(&owner, Stream(0x20)));
        for _ in 0..200 {
            let owner = Arc::new(AtomicUsize::new(NO_STREAM));
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let racers: Vec<_> = [0x10, 0x20]
                .map(|s| {
                    let (owner, barrier) = (owner.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        claim(&owner, Stream(s))
                    })
                })
                .into_iter()
                .collect();
            let won: Vec<bool> = racers.into_iter().map(|t| t.join().unwrap()).collect();
            assert_eq!(won.iter().filter(|&&w| w).count(), 1, "exactly one of two concurrent streams: {won:?}");
        }
    }

    #[test]
    fn every_group_has_its_own_generation() {
        let (a, b) = (Group::empty(2, 1 << 20, 1).unwrap(), Group::empty(2, 1 << 20, 1).unwrap());
        assert!(a.generation >= 1 && b.generation > a.generation, "{} {}", a.generation, b.generation);
        assert_eq!(a.fault(), None);
        assert!(!a.is_retired());
        a.retire();
        assert!(a.is_retired(), "retiring a group without local ranks needs no GPU");
    }
}
