//! Device memory and a stream for the setup-time collectives (the exchange's gathers), one of
//! each per device for the life of the process.
//!
//! What a gather hands to NCCL, NCCL may use as it likes: its own stream ordered after ours,
//! or, in an NCCL or stand-in built on the CUDA runtime, `cudaStreamSynchronize` and then a
//! synchronous `cudaMemcpy`, which runs on the context's legacy default stream and, from pageable
//! memory, may return before its DMA lands (issue 39). So the scratch is never freed and the
//! stream never destroyed (nothing queued on them by anyone can meet freed memory or a dead
//! stream), the memory is a plain `cuMemAlloc` allocation (no pool whose trimming or context
//! binding another runtime may not expect), and the result is read by a synchronous copy on the
//! legacy default stream after a wait for our stream: ordered after the collective whichever of
//! the two it used. Neither waits for the whole device: a peer self-test kernel that never ends
//! (a peer load over broken ACS) runs on a non-blocking stream, and this rank must still take
//! part in the gathers that tell its peers.

use super::{driver, DevicePtr, Stream};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::Mutex;

/// The largest gather (input and output together) a device's scratch takes.
pub(crate) const SETUP_SCRATCH_BYTES: usize = 64 << 10;

/// One device's setup scratch: made in its context, kept until the process ends.
#[derive(Debug)]
pub(crate) struct SetupScratch {
    /// The gathers' stream (non-blocking: it neither waits for nor holds up the legacy stream).
    stream: usize,
    memory: DevicePtr,
    /// One gather at a time on a device.
    busy: Mutex<()>,
}

impl SetupScratch {
    /// Allocates the memory and creates the stream in the current context; never released.
    pub(crate) fn new() -> Result<SetupScratch> {
        driver()?;
        let mut memory: sys::CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the allocation is kept for the life of the process.
        unsafe { driver::cuMemAlloc_v2(&mut memory, SETUP_SCRATCH_BYTES) }?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a valid out-pointer; the stream is kept for the life of the process. On failure
        // the allocation is kept too (freeing it would wait for the device).
        unsafe { driver::cuStreamCreate(&mut stream, flags) }?;
        Ok(SetupScratch { stream: stream as usize, memory: DevicePtr(memory), busy: Mutex::new(()) })
    }

    /// Gathers `mine` through `collective(stream, send, recv)`, which must enqueue a gather of
    /// `mine.len()` bytes from `send` into `recv` (`out_bytes`) on `stream`, then returns the
    /// `out_bytes` received. Its context must be current. Nothing is freed, whatever fails.
    pub(crate) fn gather(
        &self,
        mine: &[u8],
        out_bytes: usize,
        collective: impl FnOnce(Stream, DevicePtr, DevicePtr) -> Result<()>,
    ) -> Result<Vec<u8>> {
        let n = mine.len();
        if n.checked_add(out_bytes).is_none_or(|total| total > SETUP_SCRATCH_BYTES) {
            return Err(Error::SetupScratch { bytes: n.saturating_add(out_bytes), capacity: SETUP_SCRATCH_BYTES });
        }
        let _one = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        let raw = self.stream as sys::CUstream;
        let (send, recv) = (self.memory, self.memory.offset(n as u64));
        // Zeroed first, in the stream's order: a collective that reports success without writing
        // leaves zeros (no rank's record), never the bytes of an earlier gather.
        // SAFETY: both ranges lie inside the allocation (checked above); `mine` is staged before
        // the copy returns (pageable memory), so it may be dropped at once.
        unsafe { driver::cuMemsetD8Async(recv.0, 0, out_bytes, raw) }?;
        // SAFETY: as above.
        unsafe { driver::cuMemcpyHtoDAsync_v2(send.0, mine.as_ptr().cast(), n, raw) }?;
        collective(Stream(self.stream), send, recv)?;
        // SAFETY: our stream, alive for the life of the process.
        unsafe { driver::cuStreamSynchronize(raw) }?;
        let mut out = vec![0u8; out_bytes];
        // Synchronous, on the legacy default stream: after whatever the collective queued there.
        // SAFETY: `recv` holds `out_bytes` bytes; `out` is a host buffer of that size.
        unsafe { driver::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), recv.0, out_bytes) }?;
        Ok(out)
    }
}
