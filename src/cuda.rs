//! The CUDA driver, reached through cudarc with dynamic loading: the library links no CUDA
//! library, loads on machines without a GPU, and a call that needs the driver there fails with
//! [`Error::NoDriver`] instead of cudarc's panic.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::OnceLock;

/// Loads the driver and runs `cuInit` once per process.
fn driver() -> Result<()> {
    static READY: OnceLock<Result<(), i32>> = OnceLock::new();
    let ready = READY.get_or_init(|| {
        // SAFETY: is_culib_present only tries to dlopen libcuda; cuInit is safe to call any time
        // once the library is present, and is idempotent.
        unsafe {
            if !sys::is_culib_present() {
                return Err(-1);
            }
            match sys::cuInit(0) {
                sys::CUresult::CUDA_SUCCESS => Ok(()),
                e => Err(e as i32),
            }
        }
    });
    match *ready {
        Ok(()) => Ok(()),
        Err(-1) => Err(Error::NoDriver),
        Err(code) => Err(Error::Cuda { call: "cuInit", code }),
    }
}

fn check(call: &'static str, result: sys::CUresult) -> Result<()> {
    match result {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(Error::Cuda { call, code: e as i32 }),
    }
}

/// The device of the calling thread's current context (what `cudaGetDevice` returns under
/// TensorRT, which always runs plugins with the primary context of their device current).
pub fn current_device() -> Result<i32> {
    driver()?;
    let mut device: sys::CUdevice = 0;
    // SAFETY: the driver is loaded and initialised; `device` is a valid out-pointer.
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut device) })?;
    Ok(device)
}

/// Enqueues a device-to-device copy of `bytes` bytes on `stream`.
///
/// # Safety
/// `dst` and `src` must be device addresses of at least `bytes` bytes in the current context,
/// and `stream` a stream of that context (or null for the legacy default stream).
pub unsafe fn copy_async(dst: usize, src: usize, bytes: usize, stream: usize) -> Result<()> {
    driver()?;
    check("cuMemcpyDtoDAsync", sys::cuMemcpyDtoDAsync_v2(dst as u64, src as u64, bytes, stream as sys::CUstream))
}
