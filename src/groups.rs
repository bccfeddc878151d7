//! Which devices of this process form a group, and the table of groups by device.
//!
//! Single-process multi-GPU (Edge-LLM's main mode: `ncclCommInitAll`, one communicator
//! registered per device from one thread): when every rank of a communicator is registered in
//! this process, the group forms at the registration of the last one, with peer access between
//! the devices: no collective call, nothing that blocks. One rank per process: the IPC exchange
//! (`crate::exchange`). Until then, and whenever a group cannot form (no peer access, a rank
//! count without kernels), the plugin uses NCCL.
//!
//! A device whose group failed (a kernel gave up waiting for a peer, `crate::fault`) stays
//! failed, and its all-reduces fail, until the runtime releases it (NCCL from then on) or sets
//! it up again: its ranks learn of the fault at different calls, so none may fall back to NCCL
//! on its own (an NCCL all-reduce that its peers do not join never returns).

use crate::communicator::{self, CommInfo};
use crate::config::Requested;
use crate::error::{Error, Result};
use crate::fault::{self, Fault};
use crate::family::{self, RANK_COUNTS};
use crate::group::{self, Group};
use crate::registry::{self, Registration};
use crate::exchange;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a device has.
#[derive(Clone)]
enum Slot {
    /// A group, and the device's rank in it.
    Live(Arc<Group>, i32),
    /// A group that failed.
    Failed(Fault),
}

/// Which group (and rank in it) each device of this process belongs to.
static GROUPS: Mutex<Option<HashMap<i32, Slot>>> = Mutex::new(None);

fn groups() -> MutexGuard<'static, Option<HashMap<i32, Slot>>> {
    GROUPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The group `device` belongs to, and its rank there (none for a failed group).
pub fn group_for(device: i32) -> Option<(Arc<Group>, i32)> {
    lookup(device).unwrap_or_default()
}

/// The group of `device` for an all-reduce: none (NCCL), a live one, or an error when the
/// device's group failed.
pub(crate) fn lookup(device: i32) -> Result<Option<(Arc<Group>, i32)>> {
    match groups().as_ref().and_then(|m| m.get(&device).cloned()) {
        None => Ok(None),
        Some(Slot::Live(group, rank)) => Ok(Some((group, rank))),
        Some(Slot::Failed(fault)) => Err(Error::GroupFault { device, why: fault.describe() }),
    }
}

/// `group`, which a kernel on `device` found failed (enqueue): every device of the group is
/// marked failed. Calls no CUDA function (this is an enqueue thread); its kernels are aborted
/// already, on every rank.
pub(crate) fn fail(device: i32, group: &Arc<Group>, fault: Fault) {
    let mut guard = groups();
    let map = guard.get_or_insert_with(HashMap::new);
    let mut marked = false;
    for slot in map.values_mut() {
        if matches!(slot, Slot::Live(g, _) if Arc::ptr_eq(g, group)) {
            *slot = Slot::Failed(fault);
            marked = true;
        }
    }
    drop(guard);
    if marked {
        crate::log::error(&format!(
            "device {device}: {}. The custom all-reduce group is retired: every all-reduce on its devices fails until edgellmAllReduceReleaseWorkspaces (then NCCL) or edgellmAllReduceSetupWorkspaces on every rank",
            fault.describe()
        ));
    }
}

/// Releases the group of `device` (and so of all its ranks) or forgets its failure: retires
/// the group (`Group::retire`: it waits for the devices' work) and drops the table's
/// reference; the memory is freed once no CUDA graph holds it (`crate::reclaim`). Setup and
/// teardown only. Returns whether the device had a group (or a failed one).
pub fn forget(device: i32) -> bool {
    let mut guard = groups();
    let map = guard.get_or_insert_with(HashMap::new);
    let group = match map.get(&device).cloned() {
        None => return false,
        Some(Slot::Failed(_)) => {
            map.remove(&device);
            return true;
        }
        Some(Slot::Live(group, _)) => group,
    };
    map.retain(|_, slot| !matches!(slot, Slot::Live(g, _) if Arc::ptr_eq(g, &group)));
    // Release the lock before waiting for the devices: enqueue on other threads must not.
    drop(guard);
    group.retire();
    true
}

/// Tests only: makes rank `rank` of `group` (e.g. a simulated group) the group of `device`, as
/// if it had formed by registration, so that the plugin's enqueue on `device` runs it.
#[doc(hidden)]
pub fn install_for_tests(device: i32, group: Arc<Group>, rank: i32) {
    fault::clear(device);
    groups().get_or_insert_with(HashMap::new).insert(device, Slot::Live(group, rank));
}

/// Whether the custom kernels are switched off for the whole process.
fn custom_disabled() -> bool {
    crate::config().strategy == Some(Requested::Nccl)
}

/// After `device` registered `registration`: forms the group of its communicator if every rank
/// of it is now registered in this process (never blocks on other ranks), or through the IPC
/// exchange when the other ranks must be in other processes or `explicit` (the runtime asked for
/// it with edgellmAllReduceSetupWorkspaces: a collective). Logs why when no group forms.
pub fn on_register(device: i32, registration: Registration, explicit: bool) {
    forget(device);
    // The tuning file is read (and any warning about it given) now, at setup, rather than at the
    // first enqueue.
    let _ = crate::tuning::active();
    let Some(info) = communicator::describe(&registration) else {
        crate::log::info(&format!(
            "device {device}: the registered function is not a loaded NCCL's ncclAllReduce; the NCCL path only"
        ));
        return;
    };
    if info.device != device {
        crate::log::warning(&format!("device {device}: its communicator is on device {}; the NCCL path only", info.device));
        return;
    }
    // Every rank of the communicator sees the same count: they all stop here, before any
    // collective and before anything is sized by the count.
    if !RANK_COUNTS.contains(&info.nranks) || !(0..info.nranks).contains(&info.rank) {
        if info.nranks >= 2 {
            crate::log::info(&format!(
                "device {device}: rank {} of a communicator of {} ranks: no custom kernels for that count (they exist for {RANK_COUNTS:?}); the NCCL path only",
                info.rank, info.nranks
            ));
        }
        return;
    }
    let Some(ranks) = registered_ranks(info) else { return };
    if ranks.len() < info.nranks as usize {
        // Ranks missing from this process: if they cannot all be here (fewer devices than
        // ranks), they are in other processes, and the exchange at registration cannot
        // deadlock a runtime that drives several ranks from one thread. Otherwise wait for the
        // rest to register, or for edgellmAllReduceSetupWorkspaces (EDGELLM_ALLREDUCE_EXCHANGE=register
        // forces the exchange here). A rank with the custom kernels switched off takes part in
        // the exchange too, so that its peers learn it and use NCCL with it.
        let elsewhere = explicit
            || crate::cuda::device_count().is_ok_and(|n| n < info.nranks)
            || crate::config().exchange_at_register;
        if elsewhere {
            install_exchanged(device, &registration, info);
        } else {
            crate::log::verbose(&format!(
                "device {device}: rank {} of {}; {} of its ranks are registered in this process so far",
                info.rank,
                info.nranks,
                ranks.len()
            ));
        }
        return;
    }
    if custom_disabled() {
        return;
    }
    let max_bytes = group::max_message_bytes(info.nranks);
    let devices: Vec<i32> = ranks.iter().map(|&(d, _)| d).collect();
    match Group::in_process(&devices, max_bytes) {
        Ok(group) => {
            let ranks: Vec<(i32, i32, Registration)> = ranks.iter().zip(0..).map(|(&(d, reg), r)| (d, r, reg)).collect();
            if install(&Arc::new(group), &ranks) {
                crate::log::info(&format!(
                    "custom all-reduce ready: {} ranks on devices {devices:?}, messages up to {max_bytes} bytes, {} MiB of workspace per rank",
                    info.nranks,
                    family::workspace_bytes(max_bytes, info.nranks) >> 20
                ));
            }
        }
        Err(e) => crate::log::warning(&format!("custom all-reduce unavailable for devices {devices:?}: {e}; the NCCL path only")),
    }
}

/// The devices of this process registered with a rank of `info`'s communicator and their
/// registrations, in rank order (when only some are registered, only their number matters);
/// None (logged) when two claim one rank.
fn registered_ranks(info: CommInfo) -> Option<Vec<(i32, Registration)>> {
    let mut by_rank: Vec<Option<(i32, Registration)>> = vec![None; info.nranks as usize];
    for (dev, reg) in registry::all() {
        let Some(CommInfo { nranks, rank, device: comm_device }) = communicator::describe(&reg) else { continue };
        if nranks != info.nranks || comm_device != dev {
            continue;
        }
        match by_rank.get_mut(rank as usize) {
            Some(slot @ None) => *slot = Some((dev, reg)),
            _ => {
                crate::log::info(&format!(
                    "several registered communicators of {nranks} ranks claim rank {rank}: which belong together is unknown; the NCCL path only"
                ));
                return None;
            }
        }
    }
    Some(by_rank.into_iter().flatten().collect())
}

/// Records `group` for each `(device, rank, registration)`, unless a device's registration
/// changed since the group started forming (a concurrent unregistration or re-registration: the
/// group is dropped, its memory freed later). Checked and recorded under the table's lock, and an
/// unregistration removes its registration before it takes that lock to release the device's
/// group: it either comes first (the group is dropped here) or finds the group and releases it.
fn install(group: &Arc<Group>, ranks: &[(i32, i32, Registration)]) -> bool {
    let mut guard = groups();
    if !ranks.iter().all(|&(device, _, reg)| registry::get(device) == Some(reg)) {
        drop(guard);
        crate::log::info("a registration changed while its group formed: the group is dropped; the NCCL path until the next registration");
        return false;
    }
    let map = guard.get_or_insert_with(HashMap::new);
    for &(device, rank, _) in ranks {
        fault::clear(device);
        map.insert(device, Slot::Live(group.clone(), rank));
    }
    true
}

/// Runs the exchange for `device` and records the group it gives.
fn install_exchanged(device: i32, registration: &Registration, info: CommInfo) {
    match exchange::exchange(device, registration, info, custom_disabled()) {
        Ok(group) => {
            if install(&Arc::new(group), &[(device, info.rank, *registration)]) {
                crate::log::info(&format!(
                    "custom all-reduce ready: rank {} of {} on device {device} (workspaces exchanged through NCCL)",
                    info.rank, info.nranks
                ));
            }
        }
        Err(e) if custom_disabled() => crate::log::verbose(&format!("device {device}: {e}")),
        Err(e) => crate::log::warning(&format!("device {device}: custom all-reduce unavailable: {e}; the NCCL path only")),
    }
}
