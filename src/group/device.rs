//! One record per CUDA device of this process, in one table ([`TABLE`]): everything the
//! library holds for a device, set and cleared in one place.
//!
//! | part | set | cleared |
//! |---|---|---|
//! | `kernels`: the embedded kernels, loaded | first need, at setup (configure, group formation) | never: modules live as long as the process |
//! | `registration`: the runtime's communicator and `ncclAllReduce` | `edgellmAllReduceRegisterNcclComm` (replaces) | unregistration |
//! | `slot`: its group and rank, or the fault that failed it | group formation ([`install`]) | release, unregistration ([`forget`]); a fault turns it into `Failed` ([`fail`]) |
//! | `setup`: memory and a stream for the exchange's gathers (`crate::cuda::SetupScratch`) | its first exchange ([`setup_scratch`]) | never: an NCCL may still touch them |
//!
//! Beside the record, for reasons of their own: the primary context is retained by `crate::cuda`
//! (the driver's handle of an ordinal, needed below this room); the fault word is one slot of a
//! mapped page that kernels write (`super::fault`), cleared when a group forms here; the stream
//! that owns the device's rank is the group member's (`super::Member`: it lives as long as
//! the group).
//!
//! Teardown of a device (unregistration): the registration is removed first, then the group is
//! retired ([`super::Group::retire`]: it waits for the device's work and sets the abort words), and
//! its memory goes to `super::reclaim` when the last reference (a CUDA graph's) goes. A group that
//! forms concurrently checks the registrations under the table's lock before it is recorded, so it
//! either sees the removal (and is dropped) or is found and released.
//!
//! Registrations follow Edge-LLM's runtime: one communicator and `ncclAllReduce` per device,
//! registered after `ncclCommInitAll`/`ncclCommInitRank`; registering again replaces.

use super::fault::{self, Fault};
use super::Group;
use crate::cuda::{self, SetupScratch};
use crate::error::{Error, Result};
use crate::launch::kernels::DeviceKernels;
pub(crate) use crate::nccl::{Comm, Registration};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A device's group and its rank in it.
pub(crate) type Membership = (Arc<Group>, i32);

/// What a device's group is.
#[derive(Clone)]
enum Slot {
    /// A group, and the device's rank in it.
    Live(Arc<Group>, i32),
    /// A group that failed.
    Failed(Fault),
}

/// One device's record.
#[derive(Default)]
struct Device {
    kernels: Option<Arc<DeviceKernels>>,
    registration: Option<Registration>,
    slot: Option<Slot>,
    setup: Option<Arc<SetupScratch>>,
}

/// Every device this process touched, by ordinal.
static TABLE: Mutex<Option<HashMap<i32, Device>>> = Mutex::new(None);

/// The most recently registered `ncclAllReduce`, for the device-less getter of the seed API.
static LAST_ALL_REDUCE: AtomicUsize = AtomicUsize::new(0);

/// The table. A panic while holding the lock cannot leave it half-written (every update is a
/// field store), so a poisoned lock is still consistent.
fn table() -> MutexGuard<'static, Option<HashMap<i32, Device>>> {
    TABLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn with<T>(device: i32, f: impl FnOnce(&mut Device) -> T) -> T {
    f(table().get_or_insert_with(HashMap::new).entry(device).or_default())
}

fn read<T>(device: i32, f: impl FnOnce(&Device) -> T) -> Option<T> {
    table().as_ref().and_then(|m| m.get(&device)).map(f)
}

// Kernels.

/// The kernels of `device`, loaded on first use (setup time: groups and the fused op's
/// configure load them, so enqueue finds them loaded). One load at a time, outside the table's
/// lock (loading takes milliseconds; enqueue on other devices must not wait for it).
pub fn kernels(device: i32) -> Result<Arc<DeviceKernels>> {
    static LOADING: Mutex<()> = Mutex::new(());
    if let Some(Some(k)) = read(device, |d| d.kernels.clone()) {
        return Ok(k);
    }
    let _one = LOADING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(Some(k)) = read(device, |d| d.kernels.clone()) {
        return Ok(k);
    }
    let k = Arc::new(DeviceKernels::load(device)?);
    with(device, |d| d.kernels = Some(k.clone()));
    Ok(k)
}

/// The setup scratch of `device`, made in its primary context at its first exchange and kept
/// for the life of the process (one at a time, outside the table's lock, as [`kernels`]).
pub(crate) fn setup_scratch(device: i32) -> Result<Arc<SetupScratch>> {
    static MAKING: Mutex<()> = Mutex::new(());
    if let Some(Some(s)) = read(device, |d| d.setup.clone()) {
        return Ok(s);
    }
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(Some(s)) = read(device, |d| d.setup.clone()) {
        return Ok(s);
    }
    let made = Arc::new(cuda::with_device(device, SetupScratch::new)?);
    with(device, |d| d.setup = Some(made.clone()));
    Ok(made)
}

// Registrations.

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
    let previous = with(device, |d| d.registration.replace(Registration { comm, all_reduce }));
    LAST_ALL_REDUCE.store(all_reduce, Ordering::Release);
    if let Some(p) = previous.filter(|p| p.comm != comm) {
        crate::log::info(&format!("device {device}: communicator {:#x} replaces {:#x}", comm.0, p.comm.0));
    }
    Ok(())
}

/// Removes the registration of `device` if, and only if, it holds exactly `comm`.
pub(crate) fn unregister(device: i32, comm: Comm) -> Result<()> {
    let mut guard = table();
    let map = guard.get_or_insert_with(HashMap::new);
    holds(device, map.get(&device).and_then(|d| d.registration), comm)?;
    map.entry(device).or_default().registration = None;
    if map.values().all(|d| d.registration.is_none()) {
        LAST_ALL_REDUCE.store(0, Ordering::Release);
    }
    Ok(())
}

pub(crate) fn registration(device: i32) -> Option<Registration> {
    read(device, |d| d.registration).flatten()
}

/// Every registration, by device.
pub(crate) fn registrations() -> Vec<(i32, Registration)> {
    table()
        .as_ref()
        .map(|m| m.iter().filter_map(|(&dev, d)| Some((dev, d.registration?))).collect())
        .unwrap_or_default()
}

pub(crate) fn last_all_reduce() -> usize {
    LAST_ALL_REDUCE.load(Ordering::Acquire)
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
    for d in table().get_or_insert_with(HashMap::new).values_mut() {
        if matches!(&d.slot, Some(Slot::Live(g, _)) if Arc::ptr_eq(g, group)) {
            d.slot = Some(Slot::Failed(fault));
            marked = true;
        }
    }
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
    let map = guard.get_or_insert_with(HashMap::new);
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
    let map = guard.get_or_insert_with(HashMap::new);
    if !ranks.iter().all(|&(device, _, reg)| map.get(&device).and_then(|d| d.registration) == Some(reg)) {
        drop(guard);
        crate::log::info("a registration changed while its group formed: the group is dropped; the NCCL path until the next registration");
        return false;
    }
    for &(device, rank, _) in ranks {
        fault::clear(device);
        map.entry(device).or_default().slot = Some(Slot::Live(group.clone(), rank));
    }
    true
}

/// Tests only: makes rank `rank` of `group` (e.g. a simulated group) the group of `device`, as
/// if it had formed by registration, so that the plugin's enqueue on `device` runs it.
#[cfg(feature = "test-hooks")]
pub fn install_for_tests(device: i32, group: Arc<Group>, rank: i32) {
    fault::clear(device);
    with(device, |d| d.slot = Some(Slot::Live(group, rank)));
}

#[cfg(test)]
pub(crate) fn test_lock() -> MutexGuard<'static, ()> {
    // Registry tests share process-wide state; they take this lock to run one at a time.
    static TESTS: Mutex<()> = Mutex::new(());
    TESTS.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_get_replace_unregister() {
        let _serial = test_lock();
        register(40, Comm(0x1000), 0x2000).unwrap();
        assert_eq!(registration(40), Some(Registration { comm: Comm(0x1000), all_reduce: 0x2000 }));
        assert_eq!(last_all_reduce(), 0x2000);
        register(40, Comm(0x1100), 0x2000).unwrap();
        assert_eq!(registration(40).unwrap().comm, Comm(0x1100));
        assert!(unregister(40, Comm(0x1000)).is_err(), "only the registered communicator unregisters");
        assert_eq!(registration(40).unwrap().comm, Comm(0x1100));
        unregister(40, Comm(0x1100)).unwrap();
        assert_eq!(registration(40), None);
        assert!(unregister(40, Comm(0x1100)).is_err(), "a second unregister fails");
    }

    #[test]
    fn bad_registrations_are_rejected() {
        let _serial = test_lock();
        assert!(register(-1, Comm(0x1000), 0x2000).is_err());
        assert!(register(41, Comm(0), 0x2000).is_err());
        assert!(register(41, Comm(0x1000), 0).is_err());
        assert_eq!(registration(41), None);
        assert_eq!(registration(-1), None);
    }

    #[test]
    fn registrations_are_per_device() {
        let _serial = test_lock();
        register(42, Comm(0xa), 0xf).unwrap();
        register(43, Comm(0xb), 0xf).unwrap();
        assert_eq!(registration(42).unwrap().comm, Comm(0xa));
        assert_eq!(registration(43).unwrap().comm, Comm(0xb));
        unregister(42, Comm(0xa)).unwrap();
        assert_eq!(registration(43).unwrap().comm, Comm(0xb));
        unregister(43, Comm(0xb)).unwrap();
    }

    #[test]
    fn concurrent_registration_from_many_threads() {
        let _serial = test_lock();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let dev = 100 + t;
                        register(dev, Comm(0x1000 + i), 0x2000).unwrap();
                        assert_eq!(registration(dev).unwrap().comm, Comm(0x1000 + i));
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        for t in 0..8 {
            unregister(100 + t, Comm(0x1000 + 199)).unwrap();
        }
    }
}
