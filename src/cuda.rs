//! The CUDA driver, reached through cudarc's `result` layer with dynamic loading: the library
//! links no CUDA library, loads on machines without a GPU, and a call that needs the driver there
//! fails with [`Error::NoDriver`] instead of cudarc's panic. Handles are newtypes
//! ([`DevicePtr`], [`Stream`], [`Function`]); allocations are owned ([`DeviceBuffer`]).

use crate::error::{cuda, Error, Result};
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

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
    static READY: OnceLock<Option<Result<(), result::DriverError>>> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen libcuda; cuInit is idempotent.
    let ready = READY.get_or_init(|| unsafe { sys::is_culib_present() }.then(result::init));
    match ready {
        None => Err(Error::NoDriver),
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(cuda("cuInit")(*e)),
    }
}

/// The device of the calling thread's current context (what `cudaGetDevice` returns under
/// TensorRT, which always runs plugins with the primary context of their device current).
pub fn current_device() -> Result<i32> {
    driver()?;
    let mut device: sys::CUdevice = 0;
    // SAFETY: the driver is loaded and initialised; `device` is a valid out-pointer.
    unsafe { sys::cuCtxGetDevice(&mut device) }.result().map_err(cuda("cuCtxGetDevice"))?;
    Ok(device)
}

/// Enqueues a device-to-device copy of `bytes` bytes on `stream`.
///
/// # Safety
/// `dst` and `src` must be device addresses of at least `bytes` bytes in the current context,
/// and `stream` a stream of that context (or the legacy default stream).
pub unsafe fn copy_async(dst: DevicePtr, src: DevicePtr, bytes: usize, stream: Stream) -> Result<()> {
    driver()?;
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_dtod_async(dst.0, src.0, bytes, stream.raw()) }.map_err(cuda("cuMemcpyDtoDAsync"))
}

/// The primary context of `device`, retained once and kept for the life of the process (the
/// library's workspaces and modules live in it; TensorRT and cudart use the same context).
fn primary_context(device: i32) -> Result<sys::CUcontext> {
    static CONTEXTS: Mutex<Option<HashMap<i32, usize>>> = Mutex::new(None);
    driver()?;
    let mut guard = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(&ctx) = map.get(&device) {
        return Ok(ctx as sys::CUcontext);
    }
    let dev = result::device::get(device).map_err(cuda("cuDeviceGet"))?;
    // SAFETY: `dev` is a device of this driver; the context is retained for the process's life.
    let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(cuda("cuDevicePrimaryCtxRetain"))?;
    map.insert(device, ctx as usize);
    Ok(ctx)
}

/// Runs `f` with the primary context of `device` current on this thread, then restores the
/// caller's context.
pub fn with_device<T>(device: i32, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let ctx = primary_context(device)?;
    // SAFETY: ctx is a retained primary context; push and pop are balanced below.
    unsafe { sys::cuCtxPushCurrent_v2(ctx) }.result().map_err(cuda("cuCtxPushCurrent"))?;
    let outcome = f();
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let pop = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }.result().map_err(cuda("cuCtxPopCurrent"));
    outcome.and_then(|v| pop.map(|_| v))
}

/// A zero-filled device allocation of the current context, freed on drop after the context
/// finished its work (setup and teardown time only: both synchronize).
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: DevicePtr,
}

impl DeviceBuffer {
    pub fn zeroed(bytes: usize) -> Result<DeviceBuffer> {
        driver()?;
        // SAFETY: allocates in the current context; the buffer owns the allocation from here on.
        let buffer = DeviceBuffer { ptr: DevicePtr(unsafe { result::malloc_sync(bytes) }.map_err(cuda("cuMemAlloc"))?) };
        // SAFETY: the memset covers exactly the allocation.
        unsafe { result::memset_d8_sync(buffer.ptr.0, 0, bytes) }.map_err(cuda("cuMemsetD8"))?;
        result::ctx::synchronize().map_err(cuda("cuCtxSynchronize"))?;
        Ok(buffer)
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for DeviceBuffer {
    /// Must run with the allocation's context current (groups drop their buffers inside
    /// [`with_device`]); errors are logged, never panicked on.
    fn drop(&mut self) {
        // SAFETY: the buffer owns the allocation; synchronizing first lets launched work finish.
        let freed = result::ctx::synchronize().and_then(|()| unsafe { result::free_sync(self.ptr.0) });
        if let Err(e) = freed {
            crate::log::warning(&format!("freeing a device buffer: {}", cuda("cuMemFree")(e)));
        }
    }
}

/// Enables access from `device`'s context to `peer`'s memory (idempotent). False when the
/// hardware cannot (no NVLink/P2P path between the two).
pub fn enable_peer_access(device: i32, peer: i32) -> Result<bool> {
    driver()?;
    let mut can: std::ffi::c_int = 0;
    // SAFETY: valid out-pointer; device ordinals are checked by the driver.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) }.result().map_err(cuda("cuDeviceCanAccessPeer"))?;
    if can == 0 {
        return Ok(false);
    }
    let peer_ctx = primary_context(peer)?;
    with_device(device, || {
        // SAFETY: peer_ctx is a retained context; the current context is device's.
        match unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
            e => Err(cuda("cuCtxEnablePeerAccess")(result::DriverError(e))),
        }
    })
}

/// Whether kernels on `device` can exchange 16 bytes atomically in `peer`'s memory over the
/// link between them (`atom.exch.b128`, the pointer exchange of inputs read in place). Asked of
/// `cuDeviceGetP2PAtomicCapabilities` (CUDA 13 drivers); a driver without it, or any error, is
/// a no: the ranks then copy their inputs, as every group did before.
pub fn p2p_exchange_128(device: i32, peer: i32) -> bool {
    use sys::CUatomicOperationCapability_enum as Cap;
    if driver().is_err() || !driver_has("cuDeviceGetP2PAtomicCapabilities") {
        return false;
    }
    let (Ok(src), Ok(dst)) = (result::device::get(device), result::device::get(peer)) else {
        return false;
    };
    let operation = sys::CUatomicOperation_enum::CU_ATOMIC_OPERATION_EXCHANGE;
    let mut capabilities: std::ffi::c_uint = 0;
    // SAFETY: one operation, one out-value; the symbol exists (driver_has), so cudarc's loader
    // finds it instead of panicking.
    let status = unsafe { sys::cuDeviceGetP2PAtomicCapabilities(&mut capabilities, &operation, 1, src, dst) };
    status == sys::CUresult::CUDA_SUCCESS && capabilities & Cap::CU_ATOMIC_CAPABILITY_SCALAR_128 as u32 != 0
}

/// Whether the driver library cudarc loaded exports `symbol` (its loader panics on a missing
/// one). After [`driver`] succeeded, so the library is there.
fn driver_has(symbol: &str) -> bool {
    // SAFETY: the symbol is only looked up, never called through this handle.
    unsafe { sys::culib().get::<*const std::ffi::c_void>(symbol.as_bytes()) }.is_ok()
}

/// Compute capability major and multiprocessor count of `device`.
pub fn device_properties(device: i32) -> Result<(i32, i32)> {
    use sys::CUdevice_attribute::*;
    driver()?;
    let dev = result::device::get(device).map_err(cuda("cuDeviceGet"))?;
    // SAFETY: `dev` is a device of this driver; the attributes are plain integers.
    unsafe {
        let major = result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        let sms = result::device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
        Ok((major.map_err(cuda("cuDeviceGetAttribute"))?, sms.map_err(cuda("cuDeviceGetAttribute"))?))
    }
}

/// Compute capability of `device` as major * 10 + minor (90 for sm_90).
pub fn compute_capability(device: i32) -> Result<u32> {
    let (major, _) = device_properties(device)?;
    let dev = result::device::get(device).map_err(cuda("cuDeviceGet"))?;
    let attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
    // SAFETY: `dev` is a device of this driver (initialised by device_properties); a plain integer.
    let minor = unsafe { result::device::get_attribute(dev, attribute) }.map_err(cuda("cuDeviceGetAttribute"))?;
    Ok((major * 10 + minor) as u32)
}

/// Whether `stream` is being captured into a CUDA graph.
pub fn is_capturing(stream: Stream) -> Result<bool> {
    driver()?;
    // SAFETY: `stream` is the caller's stream of the current context.
    let status = unsafe { result::stream::is_capturing(stream.raw()) }.map_err(cuda("cuStreamIsCapturing"))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
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
        // SAFETY: a live function handle of a loaded module.
        unsafe { result::function::get_function_attribute(self.0, attribute) }.map_err(cuda("cuFuncGetAttribute"))
    }
}

/// Loads a fatbin into the current context and resolves `names`: None for those not in
/// `defined` (what the module defines; the driver is asked for every name when it is empty) or
/// not found.
pub fn load_module(image: &[u8], names: &[String], defined: &[&str]) -> Result<Vec<Option<Function>>> {
    driver()?;
    // SAFETY: `image` is a complete fatbin (embedded at build time); the module is never
    // unloaded, so the functions stay valid for the life of the process.
    let module = unsafe { result::module::load_data(image.as_ptr().cast()) }.map_err(cuda("cuModuleLoadData"))?;
    names
        .iter()
        .map(|name| {
            if !defined.is_empty() && !defined.contains(&name.as_str()) {
                return Ok(None);
            }
            let c_name = std::ffi::CString::new(name.as_str()).map_err(|_| Error::NoKernel(name.clone()))?;
            // SAFETY: a loaded module and a NUL-terminated name.
            match unsafe { result::module::get_function(module, c_name) } {
                Ok(f) => Ok(Some(Function(f))),
                Err(result::DriverError(sys::CUresult::CUDA_ERROR_NOT_FOUND)) => Ok(None),
                Err(e) => Err(cuda("cuModuleGetFunction")(e)),
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
pub unsafe fn launch<P>(f: Function, grid: u32, block: u32, stream: Stream, params: &P, pdl: bool) -> Result<()> {
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
    // SAFETY: the caller's contract; cudarc's result layer has no cuLaunchKernelEx.
    unsafe { sys::cuLaunchKernelEx(&config, f.0, args.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(cuda("cuLaunchKernelEx"))
}

/// Number of CUDA devices this process sees.
pub fn device_count() -> Result<i32> {
    driver()?;
    result::device::get_count().map_err(cuda("cuDeviceGetCount"))
}

/// The IPC handle of an allocation of the current context (64 opaque bytes).
pub fn ipc_handle(ptr: DevicePtr) -> Result<[u8; 64]> {
    // SAFETY: CUipcMemHandle is 64 plain bytes; all zeros is a valid value.
    let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: ptr is a cuMemAlloc allocation of the current context; valid out-pointer.
    unsafe { sys::cuIpcGetMemHandle(&mut handle, ptr.0) }.result().map_err(cuda("cuIpcGetMemHandle"))?;
    Ok(handle.reserved.map(|c| c as u8))
}

/// Where `ptr` lies: `Some((device, peer_reachable))` for device memory, `peer_reachable` when
/// it is a cuMemAlloc allocation (legacy-IPC capable) of the device's primary context, which
/// the peer access of [`enable_peer_access`] reaches (pool and VMM memory, and memory of other
/// contexts, it does not); None for any other or unknown pointer.
pub fn device_memory(ptr: DevicePtr) -> Option<(i32, bool)> {
    use sys::CUpointer_attribute as A;
    driver().ok()?;
    let (mut kind, mut device, mut plain, mut context) = (0u32, -1i32, 0u64, 0usize);
    let mut attributes = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        A::CU_POINTER_ATTRIBUTE_CONTEXT,
    ];
    let mut data: [*mut std::ffi::c_void; 4] = [
        (&mut kind as *mut u32).cast(),
        (&mut device as *mut i32).cast(),
        (&mut plain as *mut u64).cast(),
        (&mut context as *mut usize).cast(),
    ];
    // SAFETY: four attributes, each with an out-pointer at least as large as its value; an
    // unknown pointer is not an error here, it leaves the defaults (memory type 0).
    let status = unsafe { sys::cuPointerGetAttributes(4, attributes.as_mut_ptr(), data.as_mut_ptr(), ptr.0) };
    if status != sys::CUresult::CUDA_SUCCESS || kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 || device < 0 {
        return None;
    }
    let primary = plain != 0 && primary_context(device).is_ok_and(|c| c as usize == context);
    Some((device, primary))
}

/// Another process's allocation mapped into the current context; unmapped on drop, after the
/// context finished its work (which must be current then).
#[derive(Debug)]
pub struct IpcMapping {
    ptr: DevicePtr,
}

impl IpcMapping {
    pub fn open(handle: &[u8; 64]) -> Result<IpcMapping> {
        // SAFETY: as in ipc_handle.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        h.reserved = handle.map(|b| b as std::ffi::c_char);
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: valid out-pointer; the driver validates the handle.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) }.result().map_err(cuda("cuIpcOpenMemHandle"))?;
        Ok(IpcMapping { ptr: DevicePtr(ptr) })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours; synchronizing first lets launched work finish.
        let closed = result::ctx::synchronize().and_then(|()| unsafe { sys::cuIpcCloseMemHandle(self.ptr.0) }.result());
        if let Err(e) = closed {
            crate::log::warning(&format!("unmapping a peer workspace: {}", cuda("cuIpcCloseMemHandle")(e)));
        }
    }
}

/// Setup-time collectives: `enqueue(stream, scratch)` on a private stream of the current context
/// with `bytes` of zeroed device scratch, a wait for the stream, then `read(scratch)`.
pub fn with_scratch_stream<T>(
    bytes: usize,
    enqueue: impl FnOnce(Stream, DevicePtr) -> Result<()>,
    read: impl FnOnce(DevicePtr) -> Result<T>,
) -> Result<T> {
    driver()?;
    let stream = result::stream::create(result::stream::StreamKind::NonBlocking).map_err(cuda("cuStreamCreate"))?;
    let outcome = DeviceBuffer::zeroed(bytes).and_then(|scratch| {
        enqueue(Stream(stream as usize), scratch.ptr())
            // SAFETY: the stream is ours.
            .and_then(|()| unsafe { result::stream::synchronize(stream) }.map_err(cuda("cuStreamSynchronize")))
            .and_then(|()| read(scratch.ptr()))
    });
    // SAFETY: no work is left on the stream (synchronized, or nothing was enqueued).
    let _ = unsafe { result::stream::destroy(stream) };
    outcome
}

/// A zero-filled page-locked host allocation of `bytes`, mapped into the address space of every
/// context (portable, device-mapped): kernels write it, the host reads it with plain loads,
/// without synchronizing. Returns its address, which unified addressing makes the device
/// address too. Never freed (it lives as long as the process). Needs a current context.
pub fn mapped_host_page(bytes: usize) -> Result<usize> {
    driver()?;
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    // SAFETY: allocates `bytes`; the page is owned by the caller from here on.
    let host = unsafe { result::malloc_host(bytes, flags) }.map_err(cuda("cuMemHostAlloc"))?;
    // SAFETY: the allocation holds `bytes` bytes.
    unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
    let mut device: sys::CUdeviceptr = 0;
    // SAFETY: a device-mapped allocation of this process; valid out-pointer.
    let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }.result();
    match mapped {
        Ok(()) if device == host as u64 => Ok(host as usize),
        other => {
            // SAFETY: the allocation above, unused.
            let _ = unsafe { result::free_host(host) };
            let e = other.err().unwrap_or(result::DriverError(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED));
            Err(cuda("cuMemHostGetDevicePointer (unified addressing)")(e))
        }
    }
}

/// Keeps `value` alive as long as the CUDA graph being captured on `stream`, and every
/// executable graph made from it: a user object owns it, and the driver drops it when the last
/// of them is destroyed (on a thread of the driver's: the drop must call no CUDA function).
/// Returns false, dropping `value` at once, when the stream is not capturing.
pub fn tie_to_capture<T: Send + 'static>(stream: Stream, value: T) -> Result<bool> {
    if !is_capturing(stream)? {
        return Ok(false);
    }
    type CaptureInfo = unsafe extern "C" fn(
        sys::CUstream,
        *mut sys::CUstreamCaptureStatus,
        *mut sys::cuuint64_t,
        *mut sys::CUgraph,
        *mut *const sys::CUgraphNode,
        *mut *const sys::CUgraphEdgeData,
        *mut usize,
    ) -> sys::CUresult;
    // Looked up here rather than through cudarc, which panics on a driver without it (< 12.3).
    // SAFETY: the driver's function of this signature, if it has it.
    let info = unsafe { sys::culib().get::<CaptureInfo>(b"cuStreamGetCaptureInfo_v3\0") }
        .map_err(|_| Error::DriverLacks("cuStreamGetCaptureInfo_v3 (CUDA 12.3)"))?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let none = std::ptr::null_mut();
    // SAFETY: the caller's stream of the current context; the optional outputs are null.
    unsafe { info(stream.raw(), &mut status, none, &mut graph, none.cast(), none.cast(), none.cast()) }
        .result()
        .map_err(cuda("cuStreamGetCaptureInfo"))?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
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
    if let Err(e) = unsafe { sys::cuUserObjectCreate(&mut object, boxed, Some(release::<T>), 1, flags) }.result() {
        // SAFETY: not handed over: still ours.
        drop(unsafe { Box::from_raw(boxed.cast::<T>()) });
        return Err(cuda("cuUserObjectCreate")(e));
    }
    let moved = sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32;
    // SAFETY: the graph being captured; our one reference moves to it.
    if let Err(e) = unsafe { sys::cuGraphRetainUserObject(graph, object, 1, moved) }.result() {
        // SAFETY: our reference: releasing it runs `release` (the value is dropped).
        let _ = unsafe { sys::cuUserObjectRelease(object, 1) };
        return Err(cuda("cuGraphRetainUserObject")(e));
    }
    Ok(true)
}

/// Waits for the current context's work (setup and teardown only).
pub fn synchronize() -> Result<()> {
    driver()?;
    result::ctx::synchronize().map_err(cuda("cuCtxSynchronize"))
}

/// Writes the 32-bit word at `ptr` (a device address of the current context), synchronously
/// (setup and teardown only).
pub fn write_word(ptr: DevicePtr, value: u32) -> Result<()> {
    driver()?;
    // SAFETY: the caller's device word.
    unsafe { sys::cuMemsetD32_v2(ptr.0, value, 1) }.result().map_err(cuda("cuMemsetD32"))
}

/// Host-to-device and device-to-host copies of setup-time scratch (synchronous).
pub fn copy_to_device(dst: DevicePtr, src: &[u8]) -> Result<()> {
    // SAFETY: dst holds at least src.len() bytes (the caller's scratch).
    unsafe { result::memcpy_htod_sync(dst.0, src) }.map_err(cuda("cuMemcpyHtoD"))
}
pub fn copy_to_host(dst: &mut [u8], src: DevicePtr) -> Result<()> {
    // SAFETY: src holds at least dst.len() bytes (the caller's scratch).
    unsafe { result::memcpy_dtoh_sync(dst, src.0) }.map_err(cuda("cuMemcpyDtoH"))
}
