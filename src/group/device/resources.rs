//! A device's resources in its record: its primary context, kernels, setup scratch, fault word
//! and the memory released groups left there.

use super::{made, read, with, Device};
use crate::cuda::{self, Context, SetupScratch};
use crate::error::Result;
use crate::group::fault::{FaultWord, Record};
use crate::launch::kernels::DeviceKernels;
use std::sync::{Arc, Mutex};

/// The primary context of `device`, retained at first need and kept for the life of the
/// process (the one TensorRT and cudart use).
pub(crate) fn context(device: i32) -> Result<Context> {
    static RETAINING: Mutex<()> = Mutex::new(());
    let get = |d: &Device| d.context;
    made(device, &RETAINING, get, |d, c| d.context = Some(c), || cuda::retain_primary_context(device))
}

/// Runs `f` with the primary context of `device` current on this thread, then restores the
/// caller's context.
pub(crate) fn with_device<T>(device: i32, f: impl FnOnce() -> Result<T>) -> Result<T> {
    cuda::with_context(context(device)?, f)
}

/// The kernels of `device`, loaded on first use (setup time: groups and the fused op's
/// configure load them, so enqueue finds them loaded).
pub fn kernels(device: i32) -> Result<Arc<DeviceKernels>> {
    static LOADING: Mutex<()> = Mutex::new(());
    let get = |d: &Device| d.kernels.clone();
    made(
        device,
        &LOADING,
        get,
        |d, k| d.kernels = Some(k),
        || Ok(Arc::new(DeviceKernels::load(device, context(device)?)?)),
    )
}

/// The setup scratch of `device`, made in its primary context at its first exchange and kept
/// for the life of the process.
pub(crate) fn setup_scratch(device: i32) -> Result<Arc<SetupScratch>> {
    static MAKING: Mutex<()> = Mutex::new(());
    let get = |d: &Device| d.setup.clone();
    made(device, &MAKING, get, |d, s| d.setup = Some(s), || Ok(Arc::new(with_device(device, SetupScratch::new)?)))
}

/// `device`'s fault word (`crate::group::fault`), allocated at its first group and kept for the
/// life of the process.
pub(crate) fn fault_word(device: i32) -> Result<FaultWord> {
    static ALLOCATING: Mutex<()> = Mutex::new(());
    let get = |d: &Device| d.fault_word;
    made(device, &ALLOCATING, get, |d, w| d.fault_word = Some(w), || with_device(device, FaultWord::allocate))
}

/// What `device`'s fault word holds (None: no fault, or no word yet).
pub(crate) fn last_fault(device: i32) -> Option<Record> {
    read(device, |d| d.fault_word).flatten().and_then(FaultWord::read)
}

/// Hands `memory` of `device` over, to be freed at the next safe point (`super::super::reclaim`).
/// Calls no CUDA function.
pub(crate) fn defer_free(device: i32, memory: Box<dyn Send>) {
    with(device, |d| d.released.push(memory));
}

/// Takes every device's released memory, by device.
pub(crate) fn take_released() -> Vec<(i32, Vec<Box<dyn Send>>)> {
    super::devices(|all| {
        all.by_ordinal
            .iter_mut()
            .filter(|(_, d)| !d.released.is_empty())
            .map(|(&device, d)| (device, std::mem::take(&mut d.released)))
            .collect()
    })
}
