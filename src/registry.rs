//! Per-device NCCL registrations, as Edge-LLM's runtime makes them: one communicator and the
//! address of `ncclAllReduce` per CUDA device, registered after `ncclCommInitAll`/`ncclCommInitRank`
//! and unregistered when the runtime tears its communicators down. Thread-safe; registering an
//! already registered device replaces its entry (Edge-LLM does the same).

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// An `ncclComm_t` the runtime registered: opaque, owned by the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comm(pub usize);

impl Comm {
    /// The handle NCCL's functions take.
    pub(crate) fn raw(self) -> *mut std::ffi::c_void {
        self.0 as *mut std::ffi::c_void
    }
}

/// What the runtime registered for one device. Both are opaque and owned by the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    pub comm: Comm,
    /// `ncclAllReduce` of the NCCL library the runtime loaded.
    pub all_reduce: usize,
}

static REGISTRY: Mutex<Option<HashMap<i32, Registration>>> = Mutex::new(None);
/// The most recently registered `ncclAllReduce`, for the device-less getter of the seed API.
static LAST_ALL_REDUCE: AtomicUsize = AtomicUsize::new(0);

fn lock() -> MutexGuard<'static, Option<HashMap<i32, Registration>>> {
    // A panic while holding the lock cannot leave the map half-written (every update is one
    // insert or remove), so a poisoned lock is still consistent.
    REGISTRY.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether [`register`] would take these arguments; nothing is stored.
pub fn check_registration(device: i32, comm: Comm, all_reduce: usize) -> Result<()> {
    if device < 0 {
        return Err(Error::NegativeDevice(device));
    }
    if comm.0 == 0 || all_reduce == 0 {
        return Err(Error::NullRegistration { device, comm: comm.0, all_reduce });
    }
    Ok(())
}

/// Whether [`unregister`] would take these arguments now; nothing is removed.
pub fn check_unregistration(device: i32, comm: Comm) -> Result<()> {
    holds(device, get(device), comm)
}

/// Whether `registered` (device's registration) is exactly `comm`, the rule of unregistering.
fn holds(device: i32, registered: Option<Registration>, comm: Comm) -> Result<()> {
    match registered {
        Some(r) if r.comm == comm && comm.0 != 0 => Ok(()),
        Some(r) => Err(Error::OtherCommunicator { device, comm: comm.0, registered: r.comm.0 }),
        None => Err(Error::NothingRegistered(device)),
    }
}

pub fn register(device: i32, comm: Comm, all_reduce: usize) -> Result<()> {
    check_registration(device, comm, all_reduce)?;
    let previous = lock().get_or_insert_with(HashMap::new).insert(device, Registration { comm, all_reduce });
    LAST_ALL_REDUCE.store(all_reduce, Ordering::Release);
    if let Some(p) = previous.filter(|p| p.comm != comm) {
        crate::log::info(&format!("device {device}: communicator {:#x} replaces {:#x}", comm.0, p.comm.0));
    }
    Ok(())
}

/// Removes the registration of `device` if, and only if, it holds exactly `comm`.
pub fn unregister(device: i32, comm: Comm) -> Result<()> {
    let mut guard = lock();
    let map = guard.get_or_insert_with(HashMap::new);
    holds(device, map.get(&device).copied(), comm)?;
    map.remove(&device);
    if map.is_empty() {
        LAST_ALL_REDUCE.store(0, Ordering::Release);
    }
    Ok(())
}

pub fn get(device: i32) -> Option<Registration> {
    lock().as_ref().and_then(|m| m.get(&device).copied())
}

/// Every registration, by device.
pub fn all() -> Vec<(i32, Registration)> {
    lock().as_ref().map(|m| m.iter().map(|(&d, &r)| (d, r)).collect()).unwrap_or_default()
}

pub fn last_all_reduce() -> usize {
    LAST_ALL_REDUCE.load(Ordering::Acquire)
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
        assert_eq!(get(40), Some(Registration { comm: Comm(0x1000), all_reduce: 0x2000 }));
        assert_eq!(last_all_reduce(), 0x2000);
        register(40, Comm(0x1100), 0x2000).unwrap();
        assert_eq!(get(40).unwrap().comm, Comm(0x1100));
        assert!(unregister(40, Comm(0x1000)).is_err(), "only the registered communicator unregisters");
        assert_eq!(get(40).unwrap().comm, Comm(0x1100));
        unregister(40, Comm(0x1100)).unwrap();
        assert_eq!(get(40), None);
        assert!(unregister(40, Comm(0x1100)).is_err(), "a second unregister fails");
    }

    #[test]
    fn bad_registrations_are_rejected() {
        let _serial = test_lock();
        assert!(register(-1, Comm(0x1000), 0x2000).is_err());
        assert!(register(41, Comm(0), 0x2000).is_err());
        assert!(register(41, Comm(0x1000), 0).is_err());
        assert_eq!(get(41), None);
        assert_eq!(get(-1), None);
    }

    #[test]
    fn registrations_are_per_device() {
        let _serial = test_lock();
        register(42, Comm(0xa), 0xf).unwrap();
        register(43, Comm(0xb), 0xf).unwrap();
        assert_eq!(get(42).unwrap().comm, Comm(0xa));
        assert_eq!(get(43).unwrap().comm, Comm(0xb));
        unregister(42, Comm(0xa)).unwrap();
        assert_eq!(get(43).unwrap().comm, Comm(0xb));
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
                        assert_eq!(get(dev).unwrap().comm, Comm(0x1000 + i));
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
