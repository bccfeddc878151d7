//! Which devices of this process form a group (recorded in the device table, `super::device`).
//!
//! Single-process multi-GPU (Edge-LLM's main mode: `ncclCommInitAll`, one communicator
//! registered per device from one thread): when every rank of a communicator is registered in
//! this process, the group forms at the registration of the last one, with peer access between
//! the devices: no collective call, nothing that blocks. One rank per process: the IPC exchange
//! (`crate::group::exchange`). Until then, and whenever a group cannot form (no peer access, a rank
//! count without kernels), the plugin uses NCCL.
//!
//! A device whose group failed (a kernel gave up waiting for a peer, `crate::group::fault`) stays
//! failed, and its all-reduces fail, until the runtime releases it (NCCL from then on) or sets
//! it up again: its ranks learn of the fault at different calls, so none may fall back to NCCL
//! on its own (an NCCL all-reduce that its peers do not join never returns).

use super::device::{self, forget, install, Registration};
use super::{exchange, Group};
use crate::launch::family::{self, RANK_COUNTS};
use crate::nccl::communicator::{self, CommInfo};
use std::sync::Arc;

/// Whether the custom kernels are switched off for the whole process.
fn custom_disabled() -> bool {
    crate::launch::strategy::Requested::configured() == Some(crate::launch::strategy::Requested::Nccl)
}

/// After `device` registered `registration`: forms the group of its communicator if every rank
/// of it is now registered in this process (never blocks on other ranks), or through the IPC
/// exchange when the other ranks must be in other processes or `explicit` (the runtime asked for
/// it with edgellmAllReduceSetupWorkspaces: a collective). Logs why when no group forms.
pub(crate) fn on_register(device: i32, registration: Registration, explicit: bool) {
    forget(device);
    // The tuning file is read (and any warning about it given) now, at setup, rather than at the
    // first enqueue.
    let _ = crate::launch::tuning::active();
    let Some(info) = communicator::describe(&registration) else {
        crate::log::info(&format!(
            "device {device}: the registered function is not a loaded NCCL's ncclAllReduce; the NCCL path only"
        ));
        return;
    };
    if info.device != device {
        crate::log::warning(&format!(
            "device {device}: its communicator is on device {}; the NCCL path only",
            info.device
        ));
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
            || crate::config::get().exchange_at_register;
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
    let max_bytes = super::max_message_bytes(info.nranks);
    let devices: Vec<i32> = ranks.iter().map(|&(d, _)| d).collect();
    match Group::in_process(&devices, max_bytes) {
        Ok(group) => {
            let ranks: Vec<(i32, i32, Registration)> =
                ranks.iter().zip(0..).map(|(&(d, reg), r)| (d, r, reg)).collect();
            if install(&Arc::new(group), &ranks) {
                crate::log::info(&format!(
                    "custom all-reduce ready: {} ranks on devices {devices:?}, messages up to {max_bytes} bytes, {} MiB of workspace per rank",
                    info.nranks,
                    family::workspace_bytes(max_bytes, info.nranks) >> 20
                ));
            }
        }
        Err(e) => unavailable(&format!("custom all-reduce unavailable for devices {devices:?}"), &e),
    }
}

/// The devices of this process registered with a rank of `info`'s communicator and their
/// registrations, in rank order (when only some are registered, only their number matters);
/// None (logged) when two claim one rank.
fn registered_ranks(info: CommInfo) -> Option<Vec<(i32, Registration)>> {
    let mut by_rank: Vec<Option<(i32, Registration)>> = vec![None; info.nranks as usize];
    for (dev, reg) in device::registrations() {
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
        Err(e) => unavailable(&format!("device {device}: custom all-reduce unavailable"), &e),
    }
}

/// Says why no group formed: an error line when the peer self-test failed (the machine's peer
/// access is broken: the line names the pair and the fixes), a warning otherwise.
fn unavailable(what: &str, e: &crate::error::Error) {
    let line = format!("{what}: {e}; the NCCL path only");
    match e {
        crate::error::Error::SelfTest(_) => crate::log::error(&line),
        _ => crate::log::warning(&line),
    }
}
