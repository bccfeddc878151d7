//! The CUDA driver, loaded at run time (cudarc finds the library; [`driver`] declares the
//! functions with their status as a plain number): the library links no CUDA library, loads on
//! machines without a GPU, and a call that needs the driver there fails with
//! [`Error::NoDriver`] instead of a panic; any status, known or not, is an error with its number.
//! Handles are newtypes ([`DevicePtr`], [`Stream`], [`Function`]); allocations are owned
//! ([`DeviceBuffer`]).

mod driver;

use crate::error::{Error, Result};
use cudarc::driver::sys;
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
    let dev = device_handle(device)?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `dev` is a device of this driver; the context is retained for the process's life.
    unsafe { driver::cuDevicePrimaryCtxRetain(&mut ctx, dev) }?;
    map.insert(device, ctx as usize);
    Ok(ctx)
}

/// Runs `f` with the primary context of `device` current on this thread, then restores the
/// caller's context.
pub(crate) fn with_device<T>(device: i32, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let ctx = primary_context(device)?;
    // SAFETY: ctx is a retained primary context; push and pop are balanced below.
    unsafe { driver::cuCtxPushCurrent_v2(ctx) }?;
    let outcome = f();
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let pop = unsafe { driver::cuCtxPopCurrent_v2(&mut popped) };
    outcome.and_then(|v| pop.map(|_| v))
}

/// A zero-filled device allocation of the current context, freed on drop after the context
/// finished its work (setup and teardown time only: both synchronize).
#[derive(Debug)]
pub(crate) struct DeviceBuffer {
    ptr: DevicePtr,
}

impl DeviceBuffer {
    pub(crate) fn zeroed(bytes: usize) -> Result<DeviceBuffer> {
        driver()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: allocates in the current context; the buffer owns the allocation from here on.
        unsafe { driver::cuMemAlloc_v2(&mut ptr, bytes) }?;
        let buffer = DeviceBuffer { ptr: DevicePtr(ptr) };
        // SAFETY: the memset covers exactly the allocation.
        unsafe { driver::cuMemsetD8_v2(buffer.ptr.0, 0, bytes) }?;
        synchronize()?;
        Ok(buffer)
    }

    pub(crate) fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for DeviceBuffer {
    /// Must run with the allocation's context current (groups drop their buffers inside
    /// [`with_device`]); errors are logged, never panicked on.
    fn drop(&mut self) {
        // SAFETY: the buffer owns the allocation; synchronizing first lets launched work finish.
        let freed = synchronize().and_then(|()| unsafe { driver::cuMemFree_v2(self.ptr.0) });
        if let Err(e) = freed {
            crate::log::warning(&format!("freeing a device buffer: {e}"));
        }
    }
}

/// Enables access from `device`'s context to `peer`'s memory (idempotent). False when the
/// hardware cannot (no NVLink/P2P path between the two).
pub(crate) fn enable_peer_access(device: i32, peer: i32) -> Result<bool> {
    driver()?;
    let mut can: std::ffi::c_int = 0;
    // SAFETY: valid out-pointer; device ordinals are checked by the driver.
    unsafe { driver::cuDeviceCanAccessPeer(&mut can, device, peer) }?;
    if can == 0 {
        return Ok(false);
    }
    let peer_ctx = primary_context(peer)?;
    with_device(device, || {
        // SAFETY: peer_ctx is a retained context; the current context is device's.
        match unsafe { driver::cuCtxEnablePeerAccess(peer_ctx, 0) } {
            Ok(()) => Ok(true),
            Err(Error::Cuda { code: driver::ERROR_PEER_ACCESS_ALREADY_ENABLED, .. }) => Ok(true),
            Err(e) => Err(e),
        }
    })
}

/// Whether kernels on `device` can exchange 16 bytes atomically in `peer`'s memory over the
/// link between them (`atom.exch.b128`, the pointer exchange of inputs read in place). Asked of
/// `cuDeviceGetP2PAtomicCapabilities` (CUDA 13 drivers); a driver without it, or any error, is
/// a no: the ranks then copy their inputs, as every group did before.
pub(crate) fn p2p_exchange_128(device: i32, peer: i32) -> bool {
    use sys::CUatomicOperationCapability_enum as Cap;
    if driver().is_err() {
        return false;
    }
    let (Ok(src), Ok(dst)) = (device_handle(device), device_handle(peer)) else {
        return false;
    };
    let operation = sys::CUatomicOperation_enum::CU_ATOMIC_OPERATION_EXCHANGE;
    let mut capabilities: std::ffi::c_uint = 0;
    // SAFETY: one operation, one out-value; a driver without the function is an error (a no).
    let status = unsafe { driver::cuDeviceGetP2PAtomicCapabilities(&mut capabilities, &operation, 1, src, dst) };
    status.is_ok() && capabilities & Cap::CU_ATOMIC_CAPABILITY_SCALAR_128 as u32 != 0
}

/// What the driver says of the link from `device` to `peer` (`cuDeviceGetP2PAttribute`), each
/// attribute None where it did not answer (no driver, an old driver, an error). The link's class
/// is decided from these by `crate::link::classify`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pAttributes {
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
    pub access: Option<bool>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: Option<bool>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (lower is better).
    pub perf_rank: Option<i32>,
}

/// [`P2pAttributes`] of the link from `device` to `peer` (two distinct ordinals: the driver
/// rejects a device with itself).
pub fn p2p_attributes(device: i32, peer: i32) -> P2pAttributes {
    use sys::CUdevice_P2PAttribute as A;
    if driver().is_err() {
        return P2pAttributes::default();
    }
    let (Ok(src), Ok(dst)) = (device_handle(device), device_handle(peer)) else {
        return P2pAttributes::default();
    };
    let ask = |attribute: A| {
        let mut value: std::ffi::c_int = 0;
        // SAFETY: a valid out-pointer; the driver checks the devices and the attribute.
        unsafe { driver::cuDeviceGetP2PAttribute(&mut value, attribute, src, dst) }.ok().map(|()| value)
    };
    P2pAttributes {
        access: ask(A::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED).map(|v| v != 0),
        native_atomics: ask(A::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED).map(|v| v != 0),
        perf_rank: ask(A::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK),
    }
}

/// `cuDriverGetVersion`: the CUDA version the driver supports, 1000 * major + 10 * minor.
pub fn driver_version() -> Result<i32> {
    driver()?;
    let mut version = 0;
    // SAFETY: a valid out-pointer.
    unsafe { driver::cuDriverGetVersion(&mut version) }?;
    Ok(version)
}

/// The product name of `device` ("NVIDIA H200").
pub fn device_name(device: i32) -> Result<String> {
    driver()?;
    let dev = device_handle(device)?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `name.len()` bytes, NUL-terminated.
    unsafe { driver::cuDeviceGetName(name.as_mut_ptr(), name.len() as std::ffi::c_int, dev) }?;
    Ok(c_string(&name))
}

/// The PCI bus id of `device`, `domain:bus:device.function` in lower case ("0000:17:00.0").
pub fn pci_bus_id(device: i32) -> Result<String> {
    driver()?;
    let dev = device_handle(device)?;
    let mut id = [0 as std::ffi::c_char; 64];
    // SAFETY: the driver writes at most `id.len()` bytes, NUL-terminated.
    unsafe { driver::cuDeviceGetPCIBusId(id.as_mut_ptr(), id.len() as std::ffi::c_int, dev) }?;
    Ok(c_string(&id).to_ascii_lowercase())
}

/// The text of a NUL-terminated C string in `buffer` (all of it when there is no NUL).
fn c_string(buffer: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buffer.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The driver's handle of device ordinal `device`.
fn device_handle(device: i32) -> Result<sys::CUdevice> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: a valid out-pointer; the driver checks the ordinal.
    unsafe { driver::cuDeviceGet(&mut dev, device) }?;
    Ok(dev)
}

/// An integer attribute of `device`.
fn device_attribute(device: i32, attribute: sys::CUdevice_attribute) -> Result<i32> {
    let dev = device_handle(device)?;
    let mut value = 0;
    // SAFETY: `dev` is a device of this driver; the attribute is a plain integer.
    unsafe { driver::cuDeviceGetAttribute(&mut value, attribute, dev) }?;
    Ok(value)
}

/// Compute capability major and multiprocessor count of `device`.
pub(crate) fn device_properties(device: i32) -> Result<(i32, i32)> {
    use sys::CUdevice_attribute::*;
    driver()?;
    let major = device_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    Ok((major, device_attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?))
}

/// Compute capability of `device` as major * 10 + minor (90 for sm_90).
pub(crate) fn compute_capability(device: i32) -> Result<u32> {
    let (major, _) = device_properties(device)?;
    let minor = device_attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok((major * 10 + minor) as u32)
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
pub(crate) unsafe fn launch<P>(f: Function, grid: u32, block: u32, stream: Stream, params: &P, pdl: bool) -> Result<()> {
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

/// Number of CUDA devices this process sees.
pub(crate) fn device_count() -> Result<i32> {
    driver()?;
    let mut count = 0;
    // SAFETY: a valid out-pointer.
    unsafe { driver::cuDeviceGetCount(&mut count) }?;
    Ok(count)
}

/// The IPC handle of an allocation of the current context (64 opaque bytes).
pub(crate) fn ipc_handle(ptr: DevicePtr) -> Result<[u8; 64]> {
    // SAFETY: CUipcMemHandle is 64 plain bytes; all zeros is a valid value.
    let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: ptr is a cuMemAlloc allocation of the current context; valid out-pointer.
    unsafe { driver::cuIpcGetMemHandle(&mut handle, ptr.0) }?;
    Ok(handle.reserved.map(|c| c as u8))
}

/// Where `ptr` lies: `Some((device, peer_reachable))` for device memory, `peer_reachable` when
/// it is a cuMemAlloc allocation (legacy-IPC capable) of the device's primary context, which
/// the peer access of [`enable_peer_access`] reaches (pool and VMM memory, and memory of other
/// contexts, it does not); None for any other or unknown pointer.
pub(crate) fn device_memory(ptr: DevicePtr) -> Option<(i32, bool)> {
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
    let status = unsafe { driver::cuPointerGetAttributes(4, attributes.as_mut_ptr(), data.as_mut_ptr(), ptr.0) };
    if status.is_err() || kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 || device < 0 {
        return None;
    }
    let primary = plain != 0 && primary_context(device).is_ok_and(|c| c as usize == context);
    Some((device, primary))
}

/// Another process's allocation mapped into the current context; unmapped on drop, after the
/// context finished its work (which must be current then).
#[derive(Debug)]
pub(crate) struct IpcMapping {
    ptr: DevicePtr,
}

impl IpcMapping {
    pub(crate) fn open(handle: &[u8; 64]) -> Result<IpcMapping> {
        // SAFETY: as in ipc_handle.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        h.reserved = handle.map(|b| b as std::ffi::c_char);
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: valid out-pointer; the driver validates the handle.
        unsafe { driver::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) }?;
        Ok(IpcMapping { ptr: DevicePtr(ptr) })
    }

    pub(crate) fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours; synchronizing first lets launched work finish.
        let closed = synchronize().and_then(|()| unsafe { driver::cuIpcCloseMemHandle(self.ptr.0) });
        if let Err(e) = closed {
            crate::log::warning(&format!("unmapping a peer workspace: {e}"));
        }
    }
}

/// Setup-time collectives: `enqueue(stream, scratch)` on a private stream of the current context
/// with `bytes` of zeroed device scratch, a wait for the stream, then `read(scratch)`.
pub(crate) fn with_scratch_stream<T>(
    bytes: usize,
    enqueue: impl FnOnce(Stream, DevicePtr) -> Result<()>,
    read: impl FnOnce(DevicePtr) -> Result<T>,
) -> Result<T> {
    driver()?;
    let mut stream: sys::CUstream = std::ptr::null_mut();
    let non_blocking = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: a valid out-pointer; the stream is destroyed below.
    unsafe { driver::cuStreamCreate(&mut stream, non_blocking) }?;
    let outcome = DeviceBuffer::zeroed(bytes).and_then(|scratch| {
        enqueue(Stream(stream as usize), scratch.ptr())
            // SAFETY: the stream is ours.
            .and_then(|()| unsafe { driver::cuStreamSynchronize(stream) })
            .and_then(|()| read(scratch.ptr()))
    });
    // SAFETY: no work is left on the stream (synchronized, or nothing was enqueued).
    let _ = unsafe { driver::cuStreamDestroy_v2(stream) };
    outcome
}

/// A stream of the current context that does not synchronize with the legacy default stream
/// (setup-time work that must not wait for, or hold up, the application's). Its work is waited
/// for by polling ([`OwnedStream::finished`]), never by blocking. Destroyed on drop, which
/// returns at once: work still queued completes first (cuStreamDestroy). Drop it with its
/// context current.
#[derive(Debug)]
pub struct OwnedStream {
    raw: sys::CUstream,
}

impl OwnedStream {
    pub fn non_blocking() -> Result<OwnedStream> {
        driver()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a valid out-pointer; the stream is destroyed on drop.
        unsafe { driver::cuStreamCreate(&mut raw, flags) }?;
        Ok(OwnedStream { raw })
    }

    pub fn stream(&self) -> Stream {
        Stream(self.raw as usize)
    }

    /// Whether all work enqueued so far has completed (`cuStreamQuery`, which never blocks);
    /// an error when some of it failed (a sticky error of the context).
    pub fn finished(&self) -> Result<bool> {
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

/// A zero-filled page-locked host allocation, mapped into the address space of every context
/// (portable, device-mapped): kernels write it, the host reads it without synchronizing. Its
/// address is the device address too (unified addressing). Freed on drop (with a context
/// current), unless [`MappedHost::leak`]ed: memory a kernel that may still run writes.
#[derive(Debug)]
pub struct MappedHost {
    host: *mut std::ffi::c_void,
}

impl MappedHost {
    /// Allocates `bytes` (> 0). Needs a current context.
    pub fn zeroed(bytes: usize) -> Result<MappedHost> {
        driver()?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: allocates `bytes`; owned by the value returned (or freed below).
        unsafe { driver::cuMemHostAlloc(&mut host, bytes, flags) }?;
        let block = MappedHost { host };
        // SAFETY: the allocation holds `bytes` bytes.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: a device-mapped allocation of this process; valid out-pointer.
        match unsafe { driver::cuMemHostGetDevicePointer_v2(&mut device, host, 0) } {
            Ok(()) if device == host as u64 => Ok(block),
            other => Err(other.err().unwrap_or(Error::DriverLacks("unified addressing (a device pointer equal to the host pointer)"))),
        }
    }

    /// Its address (host and device).
    pub fn ptr(&self) -> *mut u8 {
        self.host.cast()
    }

    /// Never frees it (it lives as long as the process); returns its address.
    pub fn leak(self) -> usize {
        let host = self.host as usize;
        std::mem::forget(self);
        host
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        // SAFETY: our allocation; no kernel writes it any more (the owner's contract).
        if let Err(e) = unsafe { driver::cuMemFreeHost(self.host) } {
            crate::log::warning(&format!("freeing mapped host memory: {e}"));
        }
    }
}

/// A zero-filled page-locked host allocation of `bytes`, mapped into the address space of every
/// context (portable, device-mapped): kernels write it, the host reads it with plain loads,
/// without synchronizing. Returns its address, which unified addressing makes the device
/// address too. Never freed (it lives as long as the process). Needs a current context.
pub(crate) fn mapped_host_page(bytes: usize) -> Result<usize> {
    MappedHost::zeroed(bytes).map(MappedHost::leak)
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
    unsafe { driver::cuStreamGetCaptureInfo_v3(stream.raw(), &mut status, none, &mut graph, none.cast(), none.cast(), none.cast()) }?;
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

/// Waits for the current context's work (setup and teardown only).
pub(crate) fn synchronize() -> Result<()> {
    driver()?;
    // SAFETY: no arguments.
    unsafe { driver::cuCtxSynchronize() }
}

/// Writes the 32-bit word at `ptr` (a device address of the current context), synchronously
/// (setup and teardown only).
pub(crate) fn write_word(ptr: DevicePtr, value: u32) -> Result<()> {
    driver()?;
    // SAFETY: the caller's device word.
    unsafe { driver::cuMemsetD32_v2(ptr.0, value, 1) }
}

/// Host-to-device and device-to-host copies of setup-time scratch (synchronous).
pub(crate) fn copy_to_device(dst: DevicePtr, src: &[u8]) -> Result<()> {
    // SAFETY: dst holds at least src.len() bytes (the caller's scratch).
    unsafe { driver::cuMemcpyHtoD_v2(dst.0, src.as_ptr().cast(), src.len()) }
}
pub(crate) fn copy_to_host(dst: &mut [u8], src: DevicePtr) -> Result<()> {
    // SAFETY: src holds at least dst.len() bytes (the caller's scratch).
    unsafe { driver::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src.0, dst.len()) }
}
