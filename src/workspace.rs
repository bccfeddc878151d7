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
use crate::kernels::{self, AllReduceParams, DeviceKernels, Family, MAX_RANKS};
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

/// Default grid cap of a real group (one rank per GPU); `EDGELLM_ALLREDUCE_MAX_BLOCKS` overrides.
fn default_max_blocks() -> u32 {
    std::env::var("EDGELLM_ALLREDUCE_MAX_BLOCKS").ok().and_then(|v| v.parse().ok()).unwrap_or(32)
}

struct Member {
    device: i32,
    workspace: u64,
    state: u64,
    kernels: Arc<DeviceKernels>,
}

/// The ranks of one communicator that this process can drive with the custom kernels.
pub struct Group {
    pub nranks: i32,
    /// Largest message (bytes) the workspaces hold.
    pub max_bytes: u64,
    /// Grid cap: identical for every rank (the launch rule).
    pub max_blocks: u32,
    members: Vec<Member>,
    peer_ws: [u64; MAX_RANKS],
}

impl Group {
    /// Allocates one workspace per rank, rank `r` on `devices[r]`.
    fn allocate(devices: &[i32], max_bytes: u64, max_blocks: u32) -> Result<Group> {
        let nranks = devices.len() as i32;
        if !kernels::RANK_COUNTS.contains(&nranks) {
            return Err(Error::invalid(format!("no custom kernels for {nranks} ranks (they exist for {:?})", kernels::RANK_COUNTS)));
        }
        let ws_bytes = kernels::workspace_bytes(max_bytes, nranks) as usize;
        let mut group = Group { nranks, max_bytes, max_blocks, members: Vec::new(), peer_ws: [0; MAX_RANKS] };
        for (rank, &device) in devices.iter().enumerate() {
            let kernels = kernels::for_device(device)?;
            let (workspace, state) = crate::cuda::with_device(device, || {
                let workspace = crate::cuda::alloc_zeroed(ws_bytes)?;
                match crate::cuda::alloc_zeroed(kernels::state_bytes()) {
                    Ok(state) => Ok((workspace, state)),
                    Err(e) => {
                        // SAFETY: just allocated here, never shared.
                        unsafe { crate::cuda::free(workspace) }.ok();
                        Err(e)
                    }
                }
            })?;
            group.peer_ws[rank] = workspace;
            group.members.push(Member { device, workspace, state, kernels });
        }
        Ok(group)
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
        Self::allocate(devices, max_bytes, default_max_blocks())
    }

    /// `nranks` simulated ranks on one device, for tests and benchmarks. Each rank's grid is
    /// capped at SMs / nranks so that all ranks' CTAs are co-resident (they spin on each other).
    pub fn simulated(device: i32, nranks: i32, max_bytes: u64) -> Result<Group> {
        let sms = kernels::for_device(device)?.sm_count as u32;
        let max_blocks = default_max_blocks().min((sms / nranks.max(1) as u32).max(1));
        Self::allocate(&vec![device; nranks.max(0) as usize], max_bytes, max_blocks)
    }

    pub fn device(&self, rank: i32) -> i32 {
        self.members[rank as usize].device
    }

    /// Whether `family` has a kernel for this group and `dtype`, and takes `bytes`.
    pub fn serves(&self, family: Family, dtype: DataType, bytes: u64) -> bool {
        bytes <= family.max_bytes(self.max_bytes) && self.members[0].kernels.function(family, dtype, self.nranks).is_some()
    }

    /// Enqueues rank `rank`'s part of one all-reduce on `stream` (a stream of that rank's device).
    ///
    /// # Safety
    /// `input` and `output` must be 16-byte aligned device buffers of `count` elements on the
    /// rank's device, and every rank of the group must enqueue the same call (family, dtype,
    /// count) in the same order.
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
        let member = &self.members[rank as usize];
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
        member.kernels.launch(family, dtype, &params, self.max_blocks, stream)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for m in &self.members {
            let freed = crate::cuda::with_device(m.device, || {
                // SAFETY: the group owns these allocations; the last Arc is gone, so no enqueue
                // can launch on them again, and free waits for launched work to finish.
                unsafe {
                    crate::cuda::free(m.workspace)?;
                    crate::cuda::free(m.state)
                }
            });
            if let Err(e) = freed {
                crate::log::warning(&format!("freeing the workspace on device {}: {e}", m.device));
            }
        }
    }
}

/// Which group (and rank in it) each device of this process belongs to.
static GROUPS: Mutex<Option<HashMap<i32, (Arc<Group>, i32)>>> = Mutex::new(None);

fn groups() -> MutexGuard<'static, Option<HashMap<i32, (Arc<Group>, i32)>>> {
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
    if let Some((group, _)) = map.get(&device).cloned() {
        map.retain(|_, (g, _)| !Arc::ptr_eq(g, &group));
    }
}

/// Whether the custom kernels are switched off for the whole process.
pub fn custom_disabled() -> bool {
    crate::strategy::env_override() == Some(crate::strategy::Requested::Nccl)
}

/// After `device` registered `registration`: forms the group of its communicator if every rank
/// of it is now registered in this process. Never blocks on other ranks.
pub fn on_register(device: i32, registration: Registration) {
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
        crate::log::verbose(&format!(
            "device {device}: rank {} of {}; {members} of its ranks are registered in this process so far",
            info.rank, info.nranks
        ));
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
