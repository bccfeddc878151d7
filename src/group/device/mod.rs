//! One record per CUDA device of this process, in one table ([`TABLE`]): everything the
//! library holds for a device, set and cleared in one place.
//!
//! | part | set | cleared |
//! |---|---|---|
//! | `context`: its primary context, retained | first need ([`context`], [`with_device`]) | never: the library's memory and modules live in it |
//! | `kernels`: the embedded kernels, loaded | first need, at setup (configure, group formation) | never: modules live as long as the process |
//! | `setup`: memory and a stream for the exchange's gathers (`crate::cuda::SetupScratch`) | its first exchange ([`setup_scratch`]) | never: an NCCL may still touch them |
//! | `fault_word`: the word its kernels record a fault in (`super::fault`), mapped host memory | its first group ([`fault_word`]) | never (a kernel may still write it); zeroed when a group forms here |
//! | `released`: memory of released groups, waiting to be freed (`super::reclaim`) | a group's last reference goes | the next setup or teardown call |
//! | `registration`: the runtime's communicator and `ncclAllReduce` | `edgellmAllReduceRegisterNcclComm` (replaces) | unregistration |
//! | `slot`: its group and rank, or the fault that failed it | group formation ([`install`]) | release, unregistration ([`forget`]); a fault turns it into `Failed` ([`fail`]) |
//!
//! Beside the records: the most recently registered `ncclAllReduce` (the seed API's device-less
//! getter) and, outside the table, the stream that owns the device's rank (the group member's,
//! `super::Member`: it lives as long as the group).
//!
//! Teardown of a device (unregistration): the registration is removed first, then the group is
//! retired ([`super::Group::retire`]: it waits for the device's work and sets the abort words), and
//! its memory goes to `super::reclaim` when the last reference (a CUDA graph's) goes. A group that
//! forms concurrently checks the registrations under the table's lock before it is recorded, so it
//! either sees the removal (and is dropped) or is found and released.
//!
//! Registrations follow Edge-LLM's runtime: one communicator and `ncclAllReduce` per device,
//! registered after `ncclCommInitAll`/`ncclCommInitRank`; registering again replaces.

mod membership;
mod resources;

pub(crate) use membership::*;
pub(crate) use resources::*;
// The Rust API of the benchmark and the tests (lib.rs).
pub use membership::group_for;
#[cfg(feature = "test-hooks")]
pub use membership::install_for_tests;
pub use resources::kernels;

use super::fault::Fault;
use super::fault::FaultWord;
use super::Group;
use crate::cuda::{Context, SetupScratch};
use crate::launch::kernels::DeviceKernels;
pub(crate) use crate::nccl::{Comm, Registration};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Device ordinals the C API takes (`edgellmAllReduceLastError`: larger ones are refused).
pub(crate) const MAX_DEVICES: i32 = 512;

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
    context: Option<Context>,
    kernels: Option<Arc<DeviceKernels>>,
    setup: Option<Arc<SetupScratch>>,
    fault_word: Option<FaultWord>,
    released: Vec<Box<dyn Send>>,
    registration: Option<Registration>,
    slot: Option<Slot>,
}

/// Every device this process touched, by ordinal, and the most recently registered
/// `ncclAllReduce`.
#[derive(Default)]
struct Devices {
    by_ordinal: HashMap<i32, Device>,
    last_all_reduce: usize,
}

static TABLE: Mutex<Option<Devices>> = Mutex::new(None);

/// The table. A panic while holding the lock cannot leave it half-written (every update is a
/// field store), so a poisoned lock is still consistent.
fn table() -> MutexGuard<'static, Option<Devices>> {
    TABLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn devices<T>(f: impl FnOnce(&mut Devices) -> T) -> T {
    f(table().get_or_insert_with(Devices::default))
}

fn with<T>(device: i32, f: impl FnOnce(&mut Device) -> T) -> T {
    devices(|d| f(d.by_ordinal.entry(device).or_default()))
}

fn read<T>(device: i32, f: impl FnOnce(&Device) -> T) -> Option<T> {
    table().as_ref().and_then(|d| d.by_ordinal.get(&device)).map(f)
}

/// The record's part `get` of `device`, made by `make` (outside the table's lock, one at a time:
/// making takes milliseconds, and enqueue on other devices must not wait for it) when it has none.
fn made<T: Clone>(
    device: i32,
    making: &Mutex<()>,
    get: impl Fn(&Device) -> Option<T>,
    set: impl FnOnce(&mut Device, T),
    make: impl FnOnce() -> crate::error::Result<T>,
) -> crate::error::Result<T> {
    if let Some(Some(v)) = read(device, &get) {
        return Ok(v);
    }
    let _one = making.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(Some(v)) = read(device, &get) {
        return Ok(v);
    }
    let v = make()?;
    with(device, |d| set(d, v.clone()));
    Ok(v)
}

#[cfg(test)]
pub(crate) fn test_lock() -> MutexGuard<'static, ()> {
    // Registry tests share process-wide state; they take this lock to run one at a time.
    static TESTS: Mutex<()> = Mutex::new(());
    TESTS.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
