//! Memory the library owns: device allocations, other processes' allocations mapped here,
//! mapped host pages, and the setup-time copies and writes to them.

use super::{driver, Context, DevicePtr};
use crate::error::{Error, Result};
use cudarc::driver::sys;

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
    /// `crate::group::device::with_device`); errors are logged, never panicked on.
    fn drop(&mut self) {
        // SAFETY: the buffer owns the allocation; synchronizing first lets launched work finish.
        let freed = synchronize().and_then(|()| unsafe { driver::cuMemFree_v2(self.ptr.0) });
        if let Err(e) = freed {
            crate::log::warning(&format!("freeing a device buffer: {e}"));
        }
    }
}

/// The IPC handle of an allocation of the current context (64 opaque bytes).
pub(crate) fn ipc_handle(ptr: DevicePtr) -> Result<[u8; 64]> {
    // SAFETY: CUipcMemHandle is 64 plain bytes; all zeros is a valid value.
    let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: ptr is a cuMemAlloc allocation of the current context; valid out-pointer.
    unsafe { driver::cuIpcGetMemHandle(&mut handle, ptr.0) }?;
    Ok(handle.reserved.map(|c| c as u8))
}

/// Where a device allocation lies ([`device_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    pub device: i32,
    /// The context it was allocated in.
    pub context: Context,
    /// A cuMemAlloc allocation (legacy-IPC capable): pool and VMM memory are not.
    pub plain: bool,
}

/// Where `ptr` lies, when it is device memory; None for any other or unknown pointer.
pub(crate) fn device_memory(ptr: DevicePtr) -> Option<Placement> {
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
    Some(Placement { device, context: Context(context), plain: plain != 0 })
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

/// A zero-filled page-locked host allocation, mapped into the address space of every context
/// (portable, device-mapped): kernels write it, the host reads it without synchronizing. Its
/// address is the device address too (unified addressing). Freed on drop (with a context
/// current), unless [`MappedHost::leak`]ed: memory a kernel that may still run writes.
#[derive(Debug)]
pub(crate) struct MappedHost {
    host: *mut std::ffi::c_void,
}

impl MappedHost {
    /// Allocates `bytes` (> 0). Needs a current context.
    pub(crate) fn zeroed(bytes: usize) -> Result<MappedHost> {
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
            other => Err(other
                .err()
                .unwrap_or(Error::DriverLacks("unified addressing (a device pointer equal to the host pointer)"))),
        }
    }

    /// Its address (host and device).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.host.cast()
    }

    /// Never frees it (it lives as long as the process); returns its address.
    pub(crate) fn leak(self) -> usize {
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
