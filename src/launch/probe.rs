//! The link probe's kernels (`kernels/probe.cu`, whose top says what each measures and how): SM
//! copies across a link, in the direction the caller chooses by which side it makes remote, and
//! dependent round trips over it. `edgellm-allreduce-bench probe` times them; a short [`copy`]
//! also serves any check of a link's bandwidth inside the crate. Their parameter blocks are
//! mirrored here from the kernel file, not part of the cross-rank contract (`crate::contract`):
//! only the launching process reads them, and no peer's kernel meets them.

use crate::cuda::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::launch::kernels::{DeviceKernels, ProbeKernel as Kernel};
use crate::launch::launcher::Launch;
use std::ffi::c_void;
use std::mem::offset_of;

/// Threads per CTA of [`copy`] (`EAR_PROBE_THREADS`).
pub const THREADS: u32 = 512;

/// Bytes at the start of the remote buffer that [`latency`] touches (`EAR_PROBE_RING_SLOTS` ×
/// `EAR_PROBE_RING_STRIDE`: 32 slots, one per 128-byte line); the buffer must be 128-byte aligned.
pub const RING_BYTES: u64 = 4096;

/// What one round trip of [`latency`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundTrip {
    /// A load whose address is the previous load's value: one non-posted read, there and back.
    Load,
    /// An 8-byte store, then `fence.sc.sys`: one posted write, until it is visible system-wide.
    StoreFence,
}

/// `EarProbeCopyParams` (kernels/probe.cu, which asserts the same size and offsets).
#[repr(C)]
#[derive(Debug)]
struct CopyParams {
    src: *const c_void,
    dst: *mut c_void,
    bytes: u64,
    reps: u64,
}

/// `EarProbeLatencyParams` (kernels/probe.cu, which asserts the same size and offsets).
#[repr(C)]
#[derive(Debug)]
struct LatencyParams {
    remote: *mut u64,
    out: *mut u64,
    iters: u32,
    mode: u32,
}

const _: () = assert!(std::mem::size_of::<CopyParams>() == 32);
const _: () = assert!(offset_of!(CopyParams, bytes) == 16 && offset_of!(CopyParams, reps) == 24);
const _: () = assert!(std::mem::size_of::<LatencyParams>() == 24);
const _: () = assert!(offset_of!(LatencyParams, iters) == 16 && offset_of!(LatencyParams, mode) == 20);

fn function(kernels: &DeviceKernels, kernel: Kernel) -> Result<crate::cuda::Function> {
    kernels.probe(kernel).ok_or_else(|| Error::NoKernel(kernel.name().to_owned()))
}

/// Why `copy`'s arguments cannot be launched, if they cannot.
fn copy_arguments(src: DevicePtr, dst: DevicePtr, bytes: u64, reps: u64, ctas: u32) -> Result<()> {
    if bytes == 0 || !(src.0 | dst.0 | bytes).is_multiple_of(16) {
        return Err(Error::Probe(format!(
            "a copy needs 16-byte aligned buffers and a positive multiple of 16 bytes (src {:#x}, dst {:#x}, {bytes} bytes)",
            src.0, dst.0
        )));
    }
    if reps == 0 || ctas == 0 {
        return Err(Error::Probe(format!("a copy needs reps and CTAs (reps {reps}, CTAs {ctas})")));
    }
    Ok(())
}

/// Enqueues on `stream` `reps` copies of `bytes` bytes from `src` to `dst` by `ctas` CTAs of
/// [`THREADS`] threads (one launch; no early start, so a launch times alone). Push with `dst`
/// remote (SM stores over the link), pull with `src` remote (SM loads over it).
///
/// # Safety
/// `src` and `dst` must hold `bytes` bytes each, must not overlap, and must be addressable from
/// the current context (its device's memory, a peer's memory with peer access enabled, mapped
/// pinned host memory); `kernels` must be that context's and `stream` one of its streams. A load
/// from a link that never answers keeps the kernel from ending: wait for `stream` with a bound.
pub unsafe fn copy(
    kernels: &DeviceKernels,
    src: DevicePtr,
    dst: DevicePtr,
    bytes: u64,
    reps: u64,
    ctas: u32,
    stream: Stream,
) -> Result<()> {
    copy_arguments(src, dst, bytes, reps, ctas)?;
    let launch = Launch { function: function(kernels, Kernel::Copy)?, grid: ctas, block: THREADS, pdl: false };
    let params = CopyParams { src: src.as_const(), dst: dst.as_mut(), bytes, reps };
    // SAFETY: the caller's buffers, checked for alignment and size; the kernel's own block.
    unsafe { launch.run(&params, stream) }
}

/// Enqueues on `stream` one thread that times `iters` dependent round trips of kind `trip` to
/// `remote` and writes the elapsed nanoseconds to `out` (a `u64`; the next `u64` gets the
/// chase's last slot). It overwrites the first [`RING_BYTES`] of `remote`.
///
/// # Safety
/// `remote` must hold [`RING_BYTES`] bytes, 128-byte aligned, and `out` 16 bytes, 8-byte aligned,
/// both addressable from the current context, nothing else using them meanwhile; `kernels` and
/// `stream` as for [`copy`], and the same bound on the wait.
pub unsafe fn latency(
    kernels: &DeviceKernels,
    trip: RoundTrip,
    remote: DevicePtr,
    iters: u32,
    out: DevicePtr,
    stream: Stream,
) -> Result<()> {
    if remote.0 == 0 || !remote.0.is_multiple_of(128) || out.0 == 0 || !out.0.is_multiple_of(8) || iters == 0 {
        return Err(Error::Probe(format!(
            "round trips need a 128-byte aligned ring, an 8-byte aligned result and iterations (ring {:#x}, result {:#x}, {iters} iterations)",
            remote.0, out.0
        )));
    }
    let launch = Launch { function: function(kernels, Kernel::Latency)?, grid: 1, block: 1, pdl: false };
    let mode = match trip {
        RoundTrip::Load => 0,
        RoundTrip::StoreFence => 1,
    };
    let params = LatencyParams { remote: remote.as_mut().cast(), out: out.as_mut().cast(), iters, mode };
    // SAFETY: the caller's ring and result word, checked for alignment; the kernel's own block.
    unsafe { launch.run(&params, stream) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_checked_before_a_launch() {
        let (a, b) = (DevicePtr(0x1000), DevicePtr(0x2000));
        assert!(copy_arguments(a, b, 1 << 20, 1, 132).is_ok());
        assert!(copy_arguments(a, b, 0, 1, 1).is_err(), "nothing to copy");
        assert!(copy_arguments(a, b, 24, 1, 1).is_err(), "not a multiple of 16");
        assert!(copy_arguments(a.offset(8), b, 32, 1, 1).is_err(), "unaligned source");
        assert!(copy_arguments(a, b.offset(4), 32, 1, 1).is_err(), "unaligned destination");
        assert!(copy_arguments(a, b, 32, 0, 1).is_err() && copy_arguments(a, b, 32, 1, 0).is_err());
    }

    #[test]
    fn the_names_are_the_kernel_file_s() {
        let names: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, ["ear_probe_copy", "ear_probe_latency"]);
        assert!(Kernel::ALL.iter().enumerate().all(|(i, &k)| k as usize == i), "ALL is in index order");
    }
}
