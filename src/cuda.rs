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

/// The primary context of `device`, retained once and kept for the life of the process (the
/// library's workspaces and modules live in it; TensorRT and cudart use the same context).
fn primary_context(device: i32) -> Result<sys::CUcontext> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    struct Contexts(HashMap<i32, usize>);
    static CONTEXTS: Mutex<Option<Contexts>> = Mutex::new(None);
    driver()?;
    let mut guard = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    let map = &mut guard.get_or_insert_with(|| Contexts(HashMap::new())).0;
    if let Some(&ctx) = map.get(&device) {
        return Ok(ctx as sys::CUcontext);
    }
    let mut dev: sys::CUdevice = 0;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointers are valid; the driver is initialised.
    unsafe {
        check("cuDeviceGet", sys::cuDeviceGet(&mut dev, device))?;
        check("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
    }
    map.insert(device, ctx as usize);
    Ok(ctx)
}

/// Runs `f` with the primary context of `device` current on this thread, then restores the
/// caller's context.
pub fn with_device<T>(device: i32, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let ctx = primary_context(device)?;
    // SAFETY: ctx is a retained primary context; push/pop are balanced below.
    check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
    let result = f();
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let pop = check("cuCtxPopCurrent", unsafe { sys::cuCtxPopCurrent_v2(&mut popped) });
    result.and_then(|v| pop.map(|_| v))
}

/// A zero-filled device allocation in the current context (setup time only: it synchronizes).
pub fn alloc_zeroed(bytes: usize) -> Result<u64> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the memset covers exactly the allocation.
    unsafe {
        check("cuMemAlloc", sys::cuMemAlloc_v2(&mut ptr, bytes))?;
        if let Err(e) = check("cuMemsetD8", sys::cuMemsetD8_v2(ptr, 0, bytes)) {
            sys::cuMemFree_v2(ptr);
            return Err(e);
        }
        check("cuCtxSynchronize", sys::cuCtxSynchronize())?;
    }
    Ok(ptr)
}

/// Frees an allocation of the current context after the context has finished its work.
///
/// # Safety
/// `ptr` must come from [`alloc_zeroed`] in the current context and not be used afterwards.
pub unsafe fn free(ptr: u64) -> Result<()> {
    check("cuCtxSynchronize", sys::cuCtxSynchronize())?;
    check("cuMemFree", sys::cuMemFree_v2(ptr))
}

/// Enables access from `device`'s context to `peer`'s memory (idempotent). False when the
/// hardware cannot (no NVLink/P2P path between the two).
pub fn enable_peer_access(device: i32, peer: i32) -> Result<bool> {
    let mut can: std::ffi::c_int = 0;
    // SAFETY: valid out-pointer; device ordinals are checked by the driver.
    check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) })?;
    if can == 0 {
        return Ok(false);
    }
    let peer_ctx = primary_context(peer)?;
    with_device(device, || {
        // SAFETY: peer_ctx is a retained context; the current context is device's.
        match unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
            e => Err(Error::Cuda { call: "cuCtxEnablePeerAccess", code: e as i32 }),
        }
    })
}

/// Compute capability major and multiprocessor count of `device`.
pub fn device_properties(device: i32) -> Result<(i32, i32)> {
    driver()?;
    let (mut major, mut sms) = (0, 0);
    // SAFETY: valid out-pointers.
    unsafe {
        let mut dev: sys::CUdevice = 0;
        check("cuDeviceGet", sys::cuDeviceGet(&mut dev, device))?;
        use sys::CUdevice_attribute::*;
        check("cuDeviceGetAttribute", sys::cuDeviceGetAttribute(&mut major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))?;
        check("cuDeviceGetAttribute", sys::cuDeviceGetAttribute(&mut sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))?;
    }
    Ok((major, sms))
}

/// Compute capability of `device` as major * 10 + minor (90 for sm_90).
pub fn compute_capability(device: i32) -> Result<u32> {
    let (major, _) = device_properties(device)?;
    let (mut dev, mut minor): (sys::CUdevice, i32) = (0, 0);
    // SAFETY: valid out-pointers; the driver is initialised (device_properties).
    unsafe {
        check("cuDeviceGet", sys::cuDeviceGet(&mut dev, device))?;
        let attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
        check("cuDeviceGetAttribute", sys::cuDeviceGetAttribute(&mut minor, attribute, dev))?;
    }
    Ok((major * 10 + minor) as u32)
}

/// Whether `stream` is being captured into a CUDA graph.
pub fn is_capturing(stream: usize) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: valid out-pointer; `stream` is the caller's stream.
    check("cuStreamIsCapturing", unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) })?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A loaded module's kernel, usable from any thread.
#[derive(Clone, Copy, Debug)]
pub struct Function(sys::CUfunction);
// SAFETY: a CUfunction is an immutable handle the driver lets any thread launch.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Function {
    /// The virtual architecture its code was compiled from (90: compute_90), i.e. for PTX
    /// compiled at load, the PTX's: which `__CUDA_ARCH__` branches the kernel has.
    pub fn ptx_version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: a live function handle and a valid out-pointer.
        check("cuFuncGetAttribute", unsafe {
            sys::cuFuncGetAttribute(&mut v, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PTX_VERSION, self.0)
        })?;
        Ok(v)
    }
}

/// Loads a fatbin into the current context and resolves `names` (missing names are None).
pub fn load_module(image: &[u8], names: &[String]) -> Result<Vec<Option<Function>>> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is a complete fatbin (embedded at build time); the module is never
    // unloaded, so the functions stay valid for the life of the process.
    check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) })?;
    names
        .iter()
        .map(|name| {
            let c_name = std::ffi::CString::new(name.as_str()).expect("kernel names have no NUL");
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: valid module and out-pointer.
            match unsafe { sys::cuModuleGetFunction(&mut f, module, c_name.as_ptr()) } {
                sys::CUresult::CUDA_SUCCESS => Ok(Some(Function(f))),
                sys::CUresult::CUDA_ERROR_NOT_FOUND => Ok(None),
                e => Err(Error::Cuda { call: "cuModuleGetFunction", code: e as i32 }),
            }
        })
        .collect()
}

/// Launches `f` with one by-value argument block (`params`), `block` threads per CTA.
///
/// # Safety
/// `params` must be the kernel's one parameter, laid out as the kernel expects, and `stream`
/// a stream of the context `f` was loaded in.
pub unsafe fn launch<P>(f: Function, grid: u32, block: u32, stream: usize, params: &P, pdl: bool) -> Result<()> {
    let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
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
        hStream: stream as sys::CUstream,
        attrs: if pdl { &mut attr } else { std::ptr::null_mut() },
        numAttrs: pdl as u32,
    };
    let mut args = [params as *const P as *mut std::ffi::c_void];
    check("cuLaunchKernelEx", sys::cuLaunchKernelEx(&config, f.0, args.as_mut_ptr(), std::ptr::null_mut()))
}

/// Number of CUDA devices this process sees.
pub fn device_count() -> Result<i32> {
    driver()?;
    let mut n = 0;
    // SAFETY: valid out-pointer.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n)
}

/// The IPC handle of an allocation of the current context (64 opaque bytes).
pub fn ipc_handle(ptr: u64) -> Result<[u8; 64]> {
    // SAFETY: CUipcMemHandle is 64 plain bytes; all zeros is a valid value.
    let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: ptr is a cuMemAlloc allocation of the current context; valid out-pointer.
    check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr) })?;
    Ok(handle.reserved.map(|c| c as u8))
}

/// Maps another process's allocation into the current context.
pub fn ipc_open(handle: &[u8; 64]) -> Result<u64> {
    // SAFETY: as in ipc_handle.
    let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    h.reserved = handle.map(|b| b as std::ffi::c_char);
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the driver validates the handle.
    check("cuIpcOpenMemHandle", unsafe {
        sys::cuIpcOpenMemHandle_v2(&mut ptr, h, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32)
    })?;
    Ok(ptr)
}

/// Unmaps what [`ipc_open`] mapped, after the current context finished its work.
///
/// # Safety
/// `ptr` must come from [`ipc_open`] in the current context and not be used afterwards.
pub unsafe fn ipc_close(ptr: u64) -> Result<()> {
    check("cuCtxSynchronize", sys::cuCtxSynchronize())?;
    check("cuIpcCloseMemHandle", sys::cuIpcCloseMemHandle(ptr))
}

/// Setup-time collectives: `enqueue(stream, scratch)` on a private stream of the current context
/// with `bytes` of zeroed device scratch, a wait for the stream, then `read(scratch)`.
pub fn with_scratch_stream<T>(
    bytes: usize,
    enqueue: impl FnOnce(usize, u64) -> Result<()>,
    read: impl FnOnce(u64) -> Result<T>,
) -> Result<T> {
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check("cuStreamCreate", unsafe { sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) })?;
    let result = alloc_zeroed(bytes).and_then(|scratch| {
        let r = enqueue(stream as usize, scratch)
            // SAFETY: the stream is ours.
            .and_then(|()| check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(stream) }))
            .and_then(|()| read(scratch));
        // SAFETY: the stream is idle (synchronized, or nothing was enqueued).
        unsafe { free(scratch) }.ok();
        r
    });
    // SAFETY: no work is left on the stream.
    unsafe { sys::cuStreamDestroy_v2(stream) };
    result
}

/// Host-to-device and device-to-host copies of setup-time scratch (synchronous).
pub fn copy_to_device(dst: u64, src: &[u8]) -> Result<()> {
    // SAFETY: dst holds at least src.len() bytes (the caller's scratch).
    check("cuMemcpyHtoD", unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) })
}
pub fn copy_to_host(dst: &mut [u8], src: u64) -> Result<()> {
    // SAFETY: src holds at least dst.len() bytes (the caller's scratch).
    check("cuMemcpyDtoH", unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) })
}
