//! A device's registration and group in its record: registering and unregistering the
//! runtime's communicator, the group it forms, its failure and release.

#[cfg(feature = "test-hooks")]
use super::with;
use super::{devices, read, table, Membership, Slot};
use crate::error::{Error, Result};
use crate::group::fault::Fault;
use crate::group::Group;
use crate::nccl::{Comm, Registration};
use std::sync::Arc;

/// Whether [`register`] would take these arguments; nothing is stored.
pub(crate) fn check_registration(device: i32, comm: Comm, all_reduce: usize) -> Result<()> {
    if device < 0 {
        return Err(Error::NegativeDevice(device));
    }
    if comm.0 == 0 || all_reduce == 0 {
        return Err(Error::NullRegistration { device, comm: comm.0, all_reduce });
    }
    Ok(())
}

/// Whether [`unregister`] would take these arguments now; nothing is removed.
pub(crate) fn check_unregistration(device: i32, comm: Comm) -> Result<()> {
    holds(device, registration(device), comm)
}

/// Whether `registered` (device's registration) is exactly `comm`, the rule of unregistering.
fn holds(device: i32, registered: Option<Registration>, comm: Comm) -> Result<()> {
    match registered {
        Some(r) if r.comm == comm && comm.0 != 0 => Ok(()),
        Some(r) => Err(Error::OtherCommunicator { device, comm: comm.0, registered: r.comm.0 }),
        None => Err(Error::NothingRegistered(device)),
    }
}

pub(crate) fn register(device: i32, comm: Comm, all_reduce: usize) -> Result<()> {
    check_registration(device, comm, all_reduce)?;
    let previous = devices(|all| {
        all.last_all_reduce = all_reduce;
        all.by_ordinal.entry(device).or_default().registration.replace(Registration { comm, all_reduce })
    });
    if let Some(p) = previous.filter(|p| p.comm != comm) {
        crate::log::info(&format!("device {device}: communicator {:#x} replaces {:#x}", comm.0, p.comm.0));
    }
    Ok(())
}

/// Removes the registration of `device` if, and only if, it holds exactly `comm`.
pub(crate) fn unregister(device: i32, comm: Comm) -> Result<()> {
    devices(|all| {
        holds(device, all.by_ordinal.get(&device).and_then(|d| d.registration), comm)?;
        all.by_ordinal.entry(device).or_default().registration = None;
        if all.by_ordinal.values().all(|d| d.registration.is_none()) {
            all.last_all_reduce = 0;
        }
        Ok(())
    })
}

pub(crate) fn registration(device: i32) -> Option<Registration> {
    read(device, |d| d.registration).flatten()
}

/// Every registration, by device.
pub(crate) fn registrations() -> Vec<(i32, Registration)> {
    devices(|all| all.by_ordinal.iter().filter_map(|(&dev, d)| Some((dev, d.registration?))).collect())
}

/// The most recently registered `ncclAllReduce` (0 once every registration is gone).
pub(crate) fn last_all_reduce() -> usize {
    devices(|all| all.last_all_reduce)
}

// Groups.

/// What enqueue needs of `device`, in one lookup: its registration (an error without one: the
/// plugin has no path at all) and its group (none: NCCL; an error when it failed).
pub(crate) fn for_call(device: i32, tp_size: i32) -> Result<(Registration, Option<Membership>)> {
    let (registration, slot) = read(device, |d| (d.registration, d.slot.clone())).unwrap_or_default();
    let registration = registration.ok_or(Error::NotRegistered { device, tp_size })?;
    Ok((registration, live(device, slot)?))
}

fn live(device: i32, slot: Option<Slot>) -> Result<Option<Membership>> {
    match slot {
        None => Ok(None),
        Some(Slot::Live(group, rank)) => Ok(Some((group, rank))),
        Some(Slot::Failed(fault)) => Err(Error::GroupFault { device, why: fault.describe() }),
    }
}

/// The group `device` belongs to, and its rank there (none for a failed group).
pub fn group_for(device: i32) -> Option<Membership> {
    live(device, read(device, |d| d.slot.clone()).flatten()).unwrap_or_default()
}

/// `group`, which a kernel on `device` found failed (enqueue): every device of the group is
/// marked failed. Calls no CUDA function (this is an enqueue thread); its kernels are aborted
/// already, on every rank.
pub(crate) fn fail(device: i32, group: &Arc<Group>, fault: Fault) {
    let mut marked = false;
    devices(|all| {
        for d in all.by_ordinal.values_mut() {
            if matches!(&d.slot, Some(Slot::Live(g, _)) if Arc::ptr_eq(g, group)) {
                d.slot = Some(Slot::Failed(fault));
                marked = true;
            }
        }
    });
    if marked {
        crate::log::error(&format!(
            "device {device}: {}. The custom all-reduce group is retired: every all-reduce on its devices fails until edgellmAllReduceReleaseWorkspaces (then NCCL) or edgellmAllReduceSetupWorkspaces on every rank",
            fault.describe()
        ));
    }
}

/// Releases the group of `device` (and so of all its ranks) or forgets its failure: retires
/// the group (`Group::retire`: it waits for the devices' work) and drops the table's
/// references; the memory is freed once no CUDA graph holds it (`super::reclaim`). Setup and
/// teardown only. Returns whether the device had a group (or a failed one).
pub(crate) fn forget(device: i32) -> bool {
    let mut guard = table();
    let map = &mut guard.get_or_insert_with(Default::default).by_ordinal;
    let group = match map.get_mut(&device).and_then(|d| d.slot.take()) {
        None => return false,
        Some(Slot::Failed(_)) => return true,
        Some(Slot::Live(group, _)) => group,
    };
    for d in map.values_mut() {
        if matches!(&d.slot, Some(Slot::Live(g, _)) if Arc::ptr_eq(g, &group)) {
            d.slot = None;
        }
    }
    // Release the lock before waiting for the devices: enqueue on other threads must not.
    drop(guard);
    group.retire();
    true
}

/// Records `group` for each `(device, rank, registration)`, unless a device's registration
/// changed since the group started forming (a concurrent unregistration or re-registration: the
/// group is dropped, its memory freed later). Checked and recorded under the table's lock, and an
/// unregistration removes its registration (under that lock) before it releases the device's
/// group: it either comes first (the group is dropped here) or finds the group and releases it.
pub(crate) fn install(group: &Arc<Group>, ranks: &[(i32, i32, Registration)]) -> bool {
    let mut guard = table();
    let map = &mut guard.get_or_insert_with(Default::default).by_ordinal;
    if !ranks.iter().all(|&(device, _, reg)| map.get(&device).and_then(|d| d.registration) == Some(reg)) {
        drop(guard);
        crate::log::info("a registration changed while its group formed: the group is dropped; the NCCL path until the next registration");
        return false;
    }
    for &(device, rank, _) in ranks {
        let d = map.entry(device).or_default();
        d.fault_word.inspect(|w| w.clear());
        d.slot = Some(Slot::Live(group.clone(), rank));
    }
    true
}

/// Tests only: makes rank `rank` of `group` (e.g. a simulated group) the group of `device`, as
/// if it had formed by registration, so that the plugin's enqueue on `device` runs it.
#[cfg(feature = "test-hooks")]
pub fn install_for_tests(device: i32, group: Arc<Group>, rank: i32) {
    with(device, |d| {
        d.fault_word.inspect(|w| w.clear());
        d.slot = Some(Slot::Live(group, rank));
    });
}
