//! Workspaces of the custom kernels and the groups of ranks that share them.
//!
//! A [`Group`] is one communicator's ranks as seen from this process: per rank a workspace
//! (staging buffers and barrier slots that peers read and write) and a local state block (call
//! counters that only the kernels advance: CUDA-graph safe), allocated once, zero-filled, freed
//! when the group goes. Sizes follow `kernels/allreduce_params.h` (see [`kernels::workspace_bytes`]).
//!
//! Single-process multi-GPU (Edge-LLM's main mode: `ncclCommInitAll`, one communicator
//! registered per device from one thread): when every rank of a communicator is registered in
//! this process, the group forms at the registration of the last one, with peer access between
//! the devices: no collective call, nothing that blocks. Until then, and whenever a group cannot
//! form (ranks in other processes, no peer access, a rank count without kernels), the plugin uses
//! NCCL. [`Group::simulated`] puts N ranks on one device for tests and benchmarks.

use crate::communicator::{self, CommInfo};
use crate::error::{Error, Result};
use crate::kernels::{self, AllReduceParams, DeviceKernels, Family, FusedParams, Op, MAX_RANKS};
use crate::registry::{self, Registration};
use crate::tensor::DataType;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The seed's `getMaxRequiredWorkspaceSize`: the largest message the custom kernels take, per
/// rank count (16 MB up to 2 ranks, 8 MB above); `EDGELLM_ALLREDUCE_WORKSPACE_BYTES` overrides.
pub fn max_message_bytes(nranks: i32) -> u64 {
    if let Some(bytes) = std::env::var("EDGELLM_ALLREDUCE_WORKSPACE_BYTES").ok().and_then(|v| v.parse::<u64>().ok()) {
        return bytes.div_ceil(16) * 16;
    }
    if nranks <= 2 {
        16_000_000
    } else {
        8_000_000
    }
}

/// Default grid cap of a real group (one rank per GPU): 128, the kernels' maximum, and never more
/// than the SM count of any rank's GPU (all CTAs must be co-resident). On 2 x H200, 128 against
/// 64 took the two-shot from 241 to 214 us at 64 MiB and Lamport from 6.5 to 5.7 us at 1 MiB
/// (docs/PERFORMANCE.md). `EDGELLM_ALLREDUCE_MAX_BLOCKS` overrides (1 to kernels::MAX_BLOCKS).
const DEFAULT_MAX_BLOCKS: u32 = kernels::MAX_BLOCKS;
fn default_max_blocks() -> u32 {
    std::env::var("EDGELLM_ALLREDUCE_MAX_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MAX_BLOCKS)
        .clamp(1, kernels::MAX_BLOCKS)
}

/// The grid cap of a rank on `device`: the default, at most the device's SM count.
fn device_max_blocks(device: i32) -> Result<u32> {
    let sms = kernels::for_device(device)?.sm_count.max(1) as u32;
    Ok(default_max_blocks().min(sms))
}

/// A message as the kernels see it: its bytes, and for the fused op its rows.
#[derive(Clone, Copy, Debug)]
pub struct Message {
    pub bytes: u64,
    /// `(tokens, hidden)` of a fused all-reduce + residual + RMSNorm; None for a plain sum.
    pub rows: Option<(u64, u32)>,
}

/// The tensors of one fused all-reduce + residual (+ bias) + RMSNorm (device addresses).
#[derive(Clone, Copy, Debug)]
pub struct FusedCall {
    pub x: usize,
    pub residual: usize,
    /// 0: no bias.
    pub bias: usize,
    pub gamma: usize,
    pub residual_out: usize,
    pub normed: usize,
    pub tokens: u64,
    pub hidden: u32,
    pub eps: f32,
}

impl FusedCall {
    pub fn params(&self, ar: AllReduceParams) -> FusedParams {
        FusedParams {
            ar,
            residual: self.residual as u64,
            bias: self.bias as u64,
            gamma: self.gamma as u64,
            residual_out: self.residual_out as u64,
            normed: self.normed as u64,
            tokens: self.tokens,
            hidden: self.hidden,
            eps: self.eps,
        }
    }

    /// Residual + bias + RMSNorm alone, on `x_reduced` (already summed by NCCL, or one rank),
    /// with `kernels` of the current device.
    ///
    /// # Safety
    /// Every address must be a 16-byte aligned device buffer of the current device of the
    /// described size; `x_reduced` may equal `normed`.
    pub unsafe fn launch_norm(&self, kernels: &DeviceKernels, dtype: DataType, x_reduced: usize, stream: usize) -> Result<()> {
        let mut ar: AllReduceParams = std::mem::zeroed();
        ar.input = x_reduced as u64;
        ar.count = self.tokens * self.hidden as u64;
        kernels.launch_norm(dtype, &self.params(ar), stream)
    }
}

struct Member {
    device: i32,
    workspace: u64,
    state: u64,
    kernels: Arc<DeviceKernels>,
}

impl Member {
    /// One rank's workspace and state block on `device` (whose context is current).
    fn allocate(device: i32, max_bytes: u64, nranks: i32) -> Result<Member> {
        let kernels = kernels::for_device(device)?;
        kernels.require_all()?;
        let workspace = crate::cuda::alloc_zeroed(kernels::workspace_bytes(max_bytes, nranks) as usize)?;
        match crate::cuda::alloc_zeroed(kernels::state_bytes()) {
            Ok(state) => Ok(Member { device, workspace, state, kernels }),
            Err(e) => {
                // SAFETY: just allocated here, never shared.
                unsafe { crate::cuda::free(workspace) }.ok();
                Err(e)
            }
        }
    }

    /// Frees the memory (the device's context must be current).
    fn release(&self) -> Result<()> {
        // SAFETY: the member owns these allocations and nothing launches on them any more;
        // free waits for launched work to finish.
        unsafe {
            crate::cuda::free(self.workspace)?;
            crate::cuda::free(self.state)
        }
    }
}

/// The ranks of one communicator that this process can drive with the custom kernels.
pub struct Group {
    pub nranks: i32,
    /// Largest message (bytes) the workspaces hold.
    pub max_bytes: u64,
    /// Grid cap: identical for every rank (the launch rule).
    pub max_blocks: u32,
    /// Indexed by rank: the ranks this process drives (all of them in-process, one after an
    /// IPC exchange).
    members: Vec<Option<Member>>,
    /// Peers' workspaces mapped from other processes: (device of the mapping, address).
    imported: Vec<(i32, u64)>,
    peer_ws: [u64; MAX_RANKS],
}

impl Group {
    /// Allocates one workspace per rank, rank `r` on `devices[r]`.
    fn allocate(devices: &[i32], max_bytes: u64, max_blocks: u32) -> Result<Group> {
        let nranks = devices.len() as i32;
        if !kernels::RANK_COUNTS.contains(&nranks) {
            return Err(Error::invalid(format!("no custom kernels for {nranks} ranks (they exist for {:?})", kernels::RANK_COUNTS)));
        }
        let mut group = Group::empty(nranks, max_bytes, max_blocks);
        for (rank, &device) in devices.iter().enumerate() {
            let member = crate::cuda::with_device(device, || Member::allocate(device, max_bytes, nranks))?;
            group.peer_ws[rank] = member.workspace;
            group.members[rank] = Some(member);
        }
        Ok(group)
    }

    fn empty(nranks: i32, max_bytes: u64, max_blocks: u32) -> Group {
        let members = (0..nranks).map(|_| None).collect();
        Group { nranks, max_bytes, max_blocks, members, imported: Vec::new(), peer_ws: [0; MAX_RANKS] }
    }

    /// The ranks of one communicator on distinct devices of this process.
    pub fn in_process(devices: &[i32], max_bytes: u64) -> Result<Group> {
        for (i, &a) in devices.iter().enumerate() {
            for &b in &devices[i + 1..] {
                if a == b {
                    return Err(Error::invalid(format!("two ranks on device {a}")));
                }
                if !crate::cuda::enable_peer_access(a, b)? || !crate::cuda::enable_peer_access(b, a)? {
                    return Err(Error::invalid(format!("devices {a} and {b} have no peer access")));
                }
            }
        }
        let max_blocks = devices.iter().map(|&d| device_max_blocks(d)).collect::<Result<Vec<_>>>()?;
        Self::allocate(devices, max_bytes, max_blocks.into_iter().min().unwrap_or(1))
    }

    /// `nranks` simulated ranks on one device, for tests and benchmarks. Each rank's grid is
    /// capped at SMs / nranks so that all ranks' CTAs are co-resident (they spin on each other).
    pub fn simulated(device: i32, nranks: i32, max_bytes: u64) -> Result<Group> {
        let sms = kernels::for_device(device)?.sm_count as u32;
        let max_blocks = default_max_blocks().min((sms / nranks.max(1) as u32).max(1));
        Self::allocate(&vec![device; nranks.max(0) as usize], max_bytes, max_blocks)
    }

    fn local(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().flatten()
    }

    /// Whether `family` has a plain all-reduce kernel for this group and `dtype`, and takes `bytes`.
    pub fn serves(&self, family: Family, dtype: DataType, bytes: u64) -> bool {
        self.serves_message(family, dtype, &Message { bytes, rows: None })
    }

    /// Whether `family` has a kernel for this group, `dtype` and the message's op, and takes it.
    pub fn serves_message(&self, family: Family, dtype: DataType, message: &Message) -> bool {
        let fits = match message.rows {
            None => message.bytes <= family.max_bytes(self.max_bytes),
            Some((tokens, hidden)) => kernels::fused_fits(family, tokens, hidden, dtype.size(), self.max_bytes, self.nranks),
        };
        let op = if message.rows.is_some() { Op::ResidualRmsNorm } else { Op::AllReduce };
        fits && self.local().next().is_some_and(|m| m.kernels.function(family, op, dtype, self.nranks).is_some())
    }

    /// Enqueues rank `rank`'s part of one fused all-reduce + residual + RMSNorm.
    ///
    /// # Safety
    /// As [`Group::launch`], for every tensor of `call`.
    pub unsafe fn launch_fused(&self, rank: i32, family: Family, dtype: DataType, call: &FusedCall, stream: usize) -> Result<()> {
        let (member, ar) = self.params(rank, call.x, 0, call.tokens as usize * call.hidden as usize)?;
        member.kernels.launch_fused(family, dtype, &call.params(ar), self.max_blocks, stream)
    }

    fn params(&self, rank: i32, input: usize, output: usize, count: usize) -> Result<(&Member, AllReduceParams)> {
        let member = self.members.get(rank as usize).and_then(Option::as_ref).ok_or_else(|| {
            Error::invalid(format!("rank {rank} of this group is not driven by this process"))
        })?;
        let params = AllReduceParams {
            peer_ws: self.peer_ws,
            state: member.state,
            input: input as u64,
            output: output as u64,
            count: count as u64,
            ws_max_bytes: self.max_bytes,
            rank,
            nranks: self.nranks,
        };
        Ok((member, params))
    }

    /// Enqueues rank `rank`'s part of one all-reduce on `stream` (a stream of that rank's device).
    ///
    /// # Safety
    /// `input` and `output` must be 16-byte aligned device buffers of `count` elements on the
    /// rank's device, and every rank of the group must enqueue the same call (family, dtype,
    /// count) in the same order.
    #[allow(clippy::too_many_arguments)] // one call's raw operands, as enqueue receives them
    pub unsafe fn launch(
        &self,
        rank: i32,
        family: Family,
        dtype: DataType,
        input: usize,
        output: usize,
        count: usize,
        stream: usize,
    ) -> Result<()> {
        let (member, params) = self.params(rank, input, output, count)?;
        member.kernels.launch(family, dtype, &params, self.max_blocks, stream)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // The last Arc is gone: no enqueue can launch on these buffers again.
        for &(device, ptr) in &self.imported {
            // SAFETY: mapped by this group with ipc_open in device's context.
            if let Err(e) = crate::cuda::with_device(device, || unsafe { crate::cuda::ipc_close(ptr) }) {
                crate::log::warning(&format!("unmapping a peer workspace on device {device}: {e}"));
            }
        }
        for m in self.local() {
            if let Err(e) = crate::cuda::with_device(m.device, || m.release()) {
                crate::log::warning(&format!("freeing the workspace on device {}: {e}", m.device));
            }
        }
    }
}

/// Device -> its group and its rank there.
type GroupsByDevice = HashMap<i32, (Arc<Group>, i32)>;

/// Which group (and rank in it) each device of this process belongs to.
static GROUPS: Mutex<Option<GroupsByDevice>> = Mutex::new(None);

fn groups() -> MutexGuard<'static, Option<GroupsByDevice>> {
    GROUPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The group `device` belongs to, and its rank there.
pub fn group_for(device: i32) -> Option<(Arc<Group>, i32)> {
    groups().as_ref().and_then(|m| m.get(&device).cloned())
}

/// Forgets the group of `device` (and so of all its ranks); its memory is freed when the last
/// in-flight user lets go.
pub fn forget(device: i32) {
    let mut guard = groups();
    let map = guard.get_or_insert_with(HashMap::new);
    let Some((group, _)) = map.get(&device).cloned() else { return };
    map.retain(|_, (g, _)| !Arc::ptr_eq(g, &group));
    // Release the lock before the (possibly last) reference goes: freeing waits for the devices,
    // and enqueue on other threads must not wait for that.
    drop(guard);
    drop(group);
}

/// Whether the custom kernels are switched off for the whole process.
pub fn custom_disabled() -> bool {
    crate::strategy::env_override() == Some(crate::strategy::Requested::Nccl)
}

/// After `device` registered `registration`: forms the group of its communicator if every rank
/// of it is now registered in this process (never blocks on other ranks), or through the IPC
/// exchange when the other ranks must be in other processes or `explicit` (the runtime asked for
/// it with edgellmAllReduceSetupWorkspaces: a collective).
pub fn on_register(device: i32, registration: Registration, explicit: bool) {
    forget(device);
    if custom_disabled() {
        return;
    }
    let Some(info) = communicator::describe(&registration) else {
        crate::log::info(&format!(
            "device {device}: the registered function is not a loaded NCCL's ncclAllReduce; the NCCL path only"
        ));
        return;
    };
    if info.device != device || info.nranks < 2 {
        if info.device != device {
            crate::log::warning(&format!("device {device}: its communicator is on device {}; the NCCL path only", info.device));
        }
        return;
    }
    let mut by_rank: Vec<Option<i32>> = vec![None; info.nranks as usize];
    let mut members = 0;
    for (dev, reg) in registry::all() {
        let Some(CommInfo { nranks, rank, device: comm_device }) = communicator::describe(&reg) else { continue };
        if nranks != info.nranks || comm_device != dev {
            continue;
        }
        members += 1;
        match by_rank.get_mut(rank as usize) {
            Some(slot @ None) => *slot = Some(dev),
            _ => {
                crate::log::info(&format!(
                    "several registered communicators of {nranks} ranks claim rank {rank}: which belong together is unknown; the NCCL path only"
                ));
                return;
            }
        }
    }
    if members < info.nranks {
        // Ranks missing from this process: if they cannot all be here (fewer devices than
        // ranks), they are in other processes, and the exchange at registration cannot
        // deadlock a runtime that drives several ranks from one thread. Otherwise wait for the
        // rest to register, or for edgellmAllReduceSetupWorkspaces (EDGELLM_ALLREDUCE_EXCHANGE=register
        // forces the exchange here).
        let elsewhere = explicit
            || crate::cuda::device_count().is_ok_and(|n| n < info.nranks)
            || std::env::var("EDGELLM_ALLREDUCE_EXCHANGE").is_ok_and(|v| v == "register");
        if elsewhere {
            install_exchanged(device, &registration, info);
        } else {
            crate::log::verbose(&format!(
                "device {device}: rank {} of {}; {members} of its ranks are registered in this process so far",
                info.rank, info.nranks
            ));
        }
        return;
    }
    let devices: Vec<i32> = by_rank.into_iter().map(|d| d.expect("every rank found")).collect();
    let max_bytes = max_message_bytes(info.nranks);
    match Group::in_process(&devices, max_bytes) {
        Ok(group) => {
            let group = Arc::new(group);
            let mut guard = groups();
            let map = guard.get_or_insert_with(HashMap::new);
            for (rank, &dev) in devices.iter().enumerate() {
                map.insert(dev, (group.clone(), rank as i32));
            }
            crate::log::info(&format!(
                "custom all-reduce ready: {} ranks on devices {devices:?}, messages up to {max_bytes} bytes, {} MiB of workspace per rank",
                info.nranks,
                kernels::workspace_bytes(max_bytes, info.nranks) >> 20
            ));
        }
        Err(e) => crate::log::warning(&format!("custom all-reduce unavailable for devices {devices:?}: {e}; the NCCL path only")),
    }
}

/// What each rank contributes to the IPC exchange (a fixed little-endian record).
struct Record {
    ok: bool,
    nranks: i32,
    rank: i32,
    max_bytes: u64,
    host: u64,
    handle: [u8; 64],
    /// This rank's grid cap; the group takes the smallest.
    max_blocks: u32,
}

/// Names the record layout AND the kernels' cross-rank protocol: change it whenever either
/// changes, so ranks running different builds do not form a group (each rejects the other's
/// records, so all fall back to NCCL together instead of waiting on each other in kernels
/// that no longer match). "EAR4": flag values flag_value(seq, i) = 64*seq + i + 1 (the
/// two-shot above 8 MiB publishes one flag per chunk).
const RECORD_MAGIC: u32 = 0x4541_5234; // "EAR4"
const RECORD_BYTES: usize = 104;

impl Record {
    fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(self.ok as u32).to_le_bytes());
        b[8..12].copy_from_slice(&self.nranks.to_le_bytes());
        b[12..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..24].copy_from_slice(&self.max_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.host.to_le_bytes());
        b[32..96].copy_from_slice(&self.handle);
        b[96..100].copy_from_slice(&self.max_blocks.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Option<Record> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        (b.len() == RECORD_BYTES && u32_at(0) == RECORD_MAGIC).then(|| Record {
            ok: u32_at(4) == 1,
            nranks: u32_at(8) as i32,
            rank: u32_at(12) as i32,
            max_bytes: u64_at(16),
            host: u64_at(24),
            handle: b[32..96].try_into().unwrap(),
            max_blocks: u32_at(96),
        })
    }
}

/// Whether every rank can join: each record valid and ready, in rank order, with this rank's
/// rank count, workspace size and host. Every rank evaluates the same records, so all agree.
fn agree(records: &[Option<Record>], mine: &Record) -> bool {
    records.len() == mine.nranks as usize
        && records.iter().enumerate().all(|(r, rec)| {
            rec.as_ref().is_some_and(|rec| {
                rec.ok
                    && rec.nranks == mine.nranks
                    && rec.rank == r as i32
                    && rec.max_bytes == mine.max_bytes
                    && rec.host == mine.host
                    && (1..=kernels::MAX_BLOCKS).contains(&rec.max_blocks)
            })
        })
}

/// FNV-1a of the host name: ranks on different hosts never form a group (multi-node: NCCL).
fn host_id() -> u64 {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most name.len() bytes.
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    name.iter().take_while(|&&c| c != 0).fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
}

/// Multi-process groups (one rank per process or thread): every rank allocates its workspace,
/// the IPC handles go round through the registered communicator's own NCCL (`ncclAllGather`),
/// each rank maps its peers', and a second gather makes every rank agree: the group forms on all
/// ranks or on none (ranks on other hosts, an IPC failure, different settings: NCCL for all).
/// A collective: every rank must call it (each from its own thread or process); it blocks until
/// all have. Every rank takes part in both gathers even after a local failure, so none hangs.
pub fn exchange(device: i32, registration: &Registration, info: CommInfo) -> Result<Group> {
    let max_bytes = max_message_bytes(info.nranks);
    crate::cuda::with_device(device, || {
        let member = kernels::RANK_COUNTS
            .contains(&info.nranks)
            .then(|| Member::allocate(device, max_bytes, info.nranks))
            .and_then(|m| m.ok());
        let handle = member.as_ref().and_then(|m| crate::cuda::ipc_handle(m.workspace).ok());
        let mine = Record {
            ok: handle.is_some(),
            nranks: info.nranks,
            rank: info.rank,
            max_bytes,
            host: host_id(),
            handle: handle.unwrap_or([0; 64]),
            max_blocks: device_max_blocks(device).unwrap_or(1),
        };
        let gathered = communicator::all_gather(registration, info.nranks, &mine.encode());
        let mut group = Group::empty(info.nranks, max_bytes, 1);
        let mut mapped_all = false;
        if let (Ok(all), Some(m)) = (&gathered, &member) {
            let records: Vec<Option<Record>> = all.chunks_exact(RECORD_BYTES).map(Record::decode).collect();
            if agree(&records, &mine) {
                mapped_all = true;
                // Every rank sees the same records: the same grid cap everywhere.
                group.max_blocks = records.iter().flatten().map(|r| r.max_blocks).min().unwrap_or(1);
                for (r, rec) in records.iter().flatten().enumerate() {
                    if r as i32 == info.rank {
                        group.peer_ws[r] = m.workspace;
                        continue;
                    }
                    match crate::cuda::ipc_open(&rec.handle) {
                        Ok(ptr) => {
                            group.peer_ws[r] = ptr;
                            group.imported.push((device, ptr));
                        }
                        Err(e) => {
                            crate::log::warning(&format!("device {device}: mapping rank {r}'s workspace: {e}"));
                            mapped_all = false;
                        }
                    }
                }
            }
        }
        // Second round: everyone learns whether everyone mapped everything.
        let verdict = communicator::all_gather(registration, info.nranks, &[mapped_all as u8]);
        if let Some(m) = member {
            group.members[info.rank as usize] = Some(m); // from here on Drop releases it
        }
        match (gathered, verdict) {
            (Ok(_), Ok(flags)) if flags.iter().all(|&f| f == 1) => Ok(group),
            (Err(e), _) | (_, Err(e)) => Err(e),
            _ => Err(Error::invalid("not every rank could set up or map the workspaces (ranks on several hosts, no IPC between the devices, or different settings)")),
        }
    })
}

/// Runs [`exchange`] for `device` and records the group it gives.
pub fn install_exchanged(device: i32, registration: &Registration, info: CommInfo) {
    match exchange(device, registration, info) {
        Ok(group) => {
            crate::log::info(&format!(
                "custom all-reduce ready: rank {} of {} on device {device} (workspaces exchanged through NCCL)",
                info.rank, info.nranks
            ));
            groups().get_or_insert_with(HashMap::new).insert(device, (Arc::new(group), info.rank));
        }
        Err(e) => crate::log::warning(&format!("device {device}: custom all-reduce unavailable: {e}; the NCCL path only")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(rank: i32) -> Record {
        Record { ok: true, nranks: 2, rank, max_bytes: 16_000_000, host: host_id(), handle: [rank as u8; 64], max_blocks: 128 - rank as u32 }
    }
    fn round_trip(r: &Record) -> Option<Record> {
        Record::decode(&r.encode())
    }

    #[test]
    fn exchange_records_round_trip() {
        let r = round_trip(&record(1)).unwrap();
        assert_eq!((r.ok, r.nranks, r.rank, r.max_bytes, r.host, r.handle, r.max_blocks), (true, 2, 1, 16_000_000, host_id(), [1; 64], 127));
        assert!(Record::decode(&[0u8; RECORD_BYTES]).is_none(), "no magic, no record");
        assert!(Record::decode(&[0u8; 8]).is_none());
        let mut older = record(1).encode();
        older[0..4].copy_from_slice(&0x4541_5232u32.to_le_bytes()); // "EAR2": two-shot with a barrier
        assert!(Record::decode(&older).is_none(), "a build with the previous kernel protocol");
    }

    #[test]
    fn all_ranks_join_or_none() {
        let mine = record(0);
        let all = |f: &dyn Fn(&mut Record)| {
            (0..2)
                .map(|r| {
                    let mut rec = record(r);
                    if r == 1 {
                        f(&mut rec);
                    }
                    round_trip(&rec)
                })
                .collect::<Vec<_>>()
        };
        assert!(agree(&all(&|_| {}), &mine));
        assert!(!agree(&all(&|r| r.ok = false), &mine), "a rank that could not allocate");
        assert!(!agree(&all(&|r| r.host ^= 1), &mine), "a rank on another host: multi-node uses NCCL");
        assert!(!agree(&all(&|r| r.max_bytes = 8_000_000), &mine), "different workspace settings");
        assert!(!agree(&all(&|r| r.rank = 0), &mine), "ranks out of order");
        assert!(!agree(&all(&|r| r.nranks = 4), &mine));
        assert!(agree(&all(&|r| r.max_blocks = 66), &mine), "grid caps may differ: the group takes the smallest");
        assert!(!agree(&all(&|r| r.max_blocks = 0), &mine), "a grid cap out of range");
        assert!(!agree(&all(&|r| r.max_blocks = kernels::MAX_BLOCKS + 1), &mine));
        assert!(!agree(&[round_trip(&mine), None], &mine), "a garbled record");
        assert!(!agree(&[round_trip(&mine)], &mine), "a missing rank");
    }

    #[test]
    fn workspace_size_rule() {
        assert_eq!(max_message_bytes(2), 16_000_000);
        assert_eq!(max_message_bytes(8), 8_000_000);
    }
}
