//! Which devices of this process form a group, and the table of groups by device.
//!
//! Single-process multi-GPU (Edge-LLM's main mode: `ncclCommInitAll`, one communicator
//! registered per device from one thread): when every rank of a communicator is registered in
//! this process, the group forms at the registration of the last one, with peer access between
//! the devices: no collective call, nothing that blocks. One rank per process: the IPC exchange
//! (`crate::exchange`). Until then, and whenever a group cannot form (no peer access, a rank
//! count without kernels), the plugin uses NCCL.

use crate::communicator::{self, CommInfo};
use crate::config::Requested;
use crate::exchange;
use crate::family;
use crate::group::{self, Group};
use crate::registry::{self, Registration};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

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
fn custom_disabled() -> bool {
    crate::config().strategy == Some(Requested::Nccl)
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
            || crate::config().exchange_at_register;
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
    let max_bytes = group::max_message_bytes(info.nranks);
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
                family::workspace_bytes(max_bytes, info.nranks) >> 20
            ));
        }
        Err(e) => crate::log::warning(&format!("custom all-reduce unavailable for devices {devices:?}: {e}; the NCCL path only")),
    }
}

/// Runs the exchange for `device` and records the group it gives.
fn install_exchanged(device: i32, registration: &Registration, info: CommInfo) {
    match exchange::exchange(device, registration, info) {
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
