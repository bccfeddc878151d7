//! The CUDA driver, loaded at run time (cudarc finds the library; [`driver`] declares the
//! functions with their status as a plain number): the library links no CUDA library, loads on
//! machines without a GPU, and a call that needs the driver there fails with
//! [`Error::NoDriver`] instead of a panic; any status, known or not, is an error with its number.
//! Handles are newtypes ([`DevicePtr`], [`Stream`], [`Function`]); allocations are owned
//! ([`DeviceBuffer`]).

mod device;
mod driver;
mod memory;
mod scratch;

use device::device_handle;
pub(crate) use device::*;
pub(crate) use memory::*;
pub(crate) use scratch::SetupScratch;
#[cfg(test)]
pub(crate) use scratch::SETUP_SCRATCH_BYTES;

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::OnceLock;

/// A device address (`CUdeviceptr`) in, or mapped into, a context of this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub const NULL: DevicePtr = DevicePtr(0);

    /// `self + bytes`.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
    pub(crate) fn as_mut(self) -> *mut std::ffi::c_void {
        self.0 as *mut std::ffi::c_void
    }
    pub(crate) fn as_const(self) -> *const std::ffi::c_void {
        self.0 as *const std::ffi::c_void
    }
}

/// A CUDA stream (`cudaStream_t` / `CUstream`) as TensorRT hands it to `enqueue`; 0 is the
/// legacy default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream(pub usize);

impl Stream {
    fn raw(self) -> sys::CUstream {
        self.0 as sys::CUstream
    }
}

/// Loads the driver and runs `cuInit` once per process.
fn driver() -> Result<()> {
    static READY: OnceLock<Result<()>> = OnceLock::new();
    // SAFETY: cuInit is idempotent and takes no pointer.
    match READY.get_or_init(|| unsafe { driver::cuInit(0) }) {
        Ok(()) => Ok(()),
        &Err(Error::Cuda { call, code, name }) => Err(Error::Cuda { call, code, name }),
        Err(_) => Err(Error::NoDriver), // no driver library, or none with cuInit
    }
}

/// The device of the calling thread's current context (what `cudaGetDevice` returns under
/// TensorRT, which always runs plugins with the primary context of their device current).
pub(crate) fn current_device() -> Result<i32> {
    driver()?;
    let mut device: sys::CUdevice = 0;
    // SAFETY: the driver is loaded and initialised; `device` is a valid out-pointer.
    unsafe { driver::cuCtxGetDevice(&mut device) }?;
    Ok(device)
}

/// Enqueues a device-to-device copy of `bytes` bytes on `stream`.
///
/// # Safety
/// `dst` and `src` must be device addresses of at least `bytes` bytes in the current context,
/// and `stream` a stream of that context (or the legacy default stream).
pub(crate) unsafe fn copy_async(dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()> {
    driver()?;
    // SAFETY: the caller's contract.
    unsafe { driver::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, stream.raw()) }
}

/// A CUDA context (`CUcontext`). The library works in devices' primary contexts (the ones
/// TensorRT and cudart use), each retained once, for the life of the process, by the device's
/// record (`crate::group::device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Context(usize);

impl Context {
    fn raw(self) -> sys::CUcontext {
        self.0 as sys::CUcontext
    }
}

/// Retains `device`'s primary context. It is never released: the caller keeps it for the life
/// of the process (the library's workspaces and modules live in it).
pub(crate) fn retain_primary_context(device: i32) -> Result<Context> {
    driver()?;
    let dev = device_handle(device)?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `dev` is a device of this driver; valid out-pointer.
    unsafe { driver::cuDevicePrimaryCtxRetain(&mut ctx, dev) }?;
    Ok(Context(ctx as usize))
}

/// Runs `f` with `context` current on this thread, then restores the caller's context.
pub(crate) fn with_context<T>(context: Context, f: impl FnOnce() -> Result<T>) -> Result<T> {
    driver()?;
    // SAFETY: a retained context; push and pop are balanced below.
    unsafe { driver::cuCtxPushCurrent_v2(context.raw()) }?;
    let outcome = f();
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let pop = unsafe { driver::cuCtxPopCurrent_v2(&mut popped) };
    outcome.and_then(|v| pop.map(|_| v))
}

/// Whether `stream` is being captured into a CUDA graph.
pub(crate) fn is_capturing(stream: Stream) -> Result<bool> {
    driver()?;
    let mut status = 0u32;
    // SAFETY: `stream` is the caller's stream of the current context; the status is read as a
    // number (a newer driver's value is not undefined behaviour).
    unsafe { driver::cuStreamIsCapturing(stream.raw(), &mut status) }?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32)
}

/// A loaded module's kernel, usable from any thread.
#[derive(Clone, Copy, Debug)]
pub struct Function(sys::CUfunction);
// SAFETY: a CUfunction is an immutable handle the driver lets any thread launch.
unsafe impl Send for Function {}
// SAFETY: as for Send: nothing is mutated through the handle.
unsafe impl Sync for Function {}

impl Function {
    /// The virtual architecture its code was compiled from (90: compute_90), i.e. for PTX
    /// compiled at load, the PTX's: which `__CUDA_ARCH__` branches the kernel has.
    pub fn ptx_version(&self) -> Result<i32> {
        let attribute = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PTX_VERSION;
        let mut version = 0;
        // SAFETY: a live function handle of a loaded module; a plain integer.
        unsafe { driver::cuFuncGetAttribute(&mut version, attribute, self.0) }?;
        Ok(version)
    }
}

/// Loads a fatbin into the current context and resolves `names`: None for those not in
/// `defined` (what the module defines; the driver is asked for every name when it is empty) or
/// not found.
pub(crate) fn load_module(image: &[u8], names: &[String], defined: &[&str]) -> Result<Vec<Option<Function>>> {
    driver()?;
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is a complete fatbin (embedded at build time); the module is never
    // unloaded, so the functions stay valid for the life of the process.
    unsafe { driver::cuModuleLoadData(&mut module, image.as_ptr().cast()) }?;
    names
        .iter()
        .map(|name| {
            if !defined.is_empty() && !defined.contains(&name.as_str()) {
                return Ok(None);
            }
            let c_name = std::ffi::CString::new(name.as_str()).map_err(|_| Error::NoKernel(name.clone()))?;
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: a loaded module and a NUL-terminated name.
            match unsafe { driver::cuModuleGetFunction(&mut f, module, c_name.as_ptr()) } {
                Ok(()) => Ok(Some(Function(f))),
                Err(Error::Cuda { code: driver::ERROR_NOT_FOUND, .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .collect()
}

/// Launches `f` with one by-value argument block (`params`), `block` threads per CTA, and
/// programmatic stream serialization when `pdl` (the kernels' griddepcontrol.wait).
///
/// # Safety
/// `params` must be the kernel's one parameter, laid out as the kernel expects, and describe
/// memory the kernel may access; `stream` must be a stream of the context `f` was loaded in.
pub(crate) unsafe fn launch<P>(
    f: Function,
    grid: u32,
    block: u32,
    stream: Stream,
    params: &P,
    pdl: bool,
) -> Result<()> {
    // SAFETY: CUlaunchAttribute is a plain C struct; all zeros is a valid value.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream.raw(),
        attrs: if pdl { &mut attr } else { std::ptr::null_mut() },
        numAttrs: pdl as u32,
    };
    let mut args = [params as *const P as *mut std::ffi::c_void];
    // SAFETY: the caller's contract.
    unsafe { driver::cuLaunchKernelEx(&config, f.0, args.as_mut_ptr(), std::ptr::null_mut()) }
}

/// A stream of the current context that does not synchronize with the legacy default stream
/// (setup-time work that must not wait for, or hold up, the application's). Its work is waited
/// for by polling ([`OwnedStream::finished`]), never by blocking. Destroyed on drop, which
/// returns at once: work still queued completes first (cuStreamDestroy). Drop it with its
/// context current.
#[derive(Debug)]
pub(crate) struct OwnedStream {
    raw: sys::CUstream,
}

impl OwnedStream {
    pub(crate) fn non_blocking() -> Result<OwnedStream> {
        driver()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a valid out-pointer; the stream is destroyed on drop.
        unsafe { driver::cuStreamCreate(&mut raw, flags) }?;
        Ok(OwnedStream { raw })
    }

    pub(crate) fn stream(&self) -> Stream {
        Stream(self.raw as usize)
    }

    /// Whether all work enqueued so far has completed (`cuStreamQuery`, which never blocks);
    /// an error when some of it failed (a sticky error of the context).
    pub(crate) fn finished(&self) -> Result<bool> {
        // SAFETY: the stream is ours and alive.
        match unsafe { driver::cuStreamQuery(self.raw) } {
            Ok(()) => Ok(true),
            Err(Error::Cuda { code: driver::ERROR_NOT_READY, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: the stream is ours; the driver releases it once its work completed.
        let _ = unsafe { driver::cuStreamDestroy_v2(self.raw) };
    }
}

/// Keeps `value` alive as long as the CUDA graph being captured on `stream`, and every
/// executable graph made from it: a user object owns it, and the driver drops it when the last
/// of them is destroyed (on a thread of the driver's: the drop must call no CUDA function).
/// Returns false, dropping `value` at once, when the stream is not capturing.
pub(crate) fn tie_to_capture<T: Send + 'static>(stream: Stream, value: T) -> Result<bool> {
    if !is_capturing(stream)? {
        return Ok(false);
    }
    let mut status = 0u32;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let none = std::ptr::null_mut();
    // SAFETY: the caller's stream of the current context; the optional outputs are null. A
    // driver older than 12.3 lacks the function: an error, not a panic.
    unsafe {
        driver::cuStreamGetCaptureInfo_v3(
            stream.raw(),
            &mut status,
            none,
            &mut graph,
            none.cast(),
            none.cast(),
            none.cast(),
        )
    }?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32 {
        return Ok(false);
    }
    unsafe extern "C" fn release<T>(value: *mut std::ffi::c_void) {
        // A driver thread: nothing may unwind out of it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the Box tie_to_capture leaked into the user object, released once.
            drop(unsafe { Box::from_raw(value.cast::<T>()) })
        }));
    }
    let boxed = Box::into_raw(Box::new(value)).cast::<std::ffi::c_void>();
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    let flags = sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
    // SAFETY: the user object owns `boxed` from here on; `release` frees it exactly once.
    if let Err(e) = unsafe { driver::cuUserObjectCreate(&mut object, boxed, Some(release::<T>), 1, flags) } {
        // SAFETY: not handed over: still ours.
        drop(unsafe { Box::from_raw(boxed.cast::<T>()) });
        return Err(e);
    }
    let moved = sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32;
    // SAFETY: the graph being captured; our one reference moves to it.
    if let Err(e) = unsafe { driver::cuGraphRetainUserObject(graph, object, 1, moved) } {
        // SAFETY: our reference: releasing it runs `release` (the value is dropped).
        let _ = unsafe { driver::cuUserObjectRelease(object, 1) };
        return Err(e);
    }
    Ok(true)
}
