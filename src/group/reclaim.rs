//! Memory of groups that are gone, freed later, at a safe point. A group's last reference can
//! drop on an enqueue thread (which may be capturing a CUDA graph: synchronizing or freeing
//! there would break the capture) or in the driver's callback that drops a destroyed graph's
//! references (where no CUDA function may be called). So a dropped group only hands its memory
//! over here, and it is freed, each piece in its device's context after the device finished its
//! work, by the runtime's own setup and teardown calls (registration, unregistration,
//! `edgellmAllReduceSetupWorkspaces`, `edgellmAllReduceReleaseWorkspaces`), before a new group
//! allocates, or by [`free_released_memory`].

use super::device;

/// Hands `memory` of `device` over, to be freed at the next safe point (it waits in the device's
/// record). Calls no CUDA function. `memory`'s drop frees it: it must run with its device's
/// context current.
pub(crate) fn defer(device: i32, memory: impl Send + 'static) {
    device::defer_free(device, Box::new(memory));
}

/// Frees what released groups left (on this thread, which must not be capturing a CUDA graph:
/// each device's context is synchronized first). Returns how many pieces were freed.
pub fn free_released_memory() -> usize {
    let mut count = 0;
    for (device, pieces) in device::take_released() {
        count += pieces.len();
        let mut pieces = Some(pieces);
        if let Err(e) = device::with_device(device, || {
            drop(pieces.take());
            Ok(())
        }) {
            // Its context cannot be made current: leaked rather than freed in another one.
            std::mem::forget(pieces);
            crate::log::warning(&format!("freeing a released workspace on device {device}: {e}"));
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn deferred_memory_is_kept_until_freed_and_never_dropped_on_the_deferring_thread() {
        let _serial = crate::group::device::test_lock();
        let drops = Arc::new(AtomicUsize::new(0));
        defer(0, Counted(drops.clone()));
        defer(0, Counted(drops.clone()));
        assert_eq!(drops.load(Ordering::SeqCst), 0, "deferring frees nothing");
        // Without a driver no context can be made current: the pieces are then leaked (with a
        // warning), never dropped outside their context.
        let context = device::with_device(0, || Ok(())).is_ok();
        assert!(free_released_memory() >= 2);
        assert_eq!(free_released_memory(), 0, "nothing is left");
        assert_eq!(drops.load(Ordering::SeqCst), if context { 2 } else { 0 });
    }
}
