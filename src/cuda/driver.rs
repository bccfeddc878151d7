//! The CUDA driver's functions, each looked up once in the library cudarc loaded and called with
//! its status as a plain `u32`. cudarc declares them returning its `CUresult` enum, and a code
//! that enum does not list (a newer driver's, a stand-in's) is undefined behaviour there: it
//! killed the process (SIGILL) in enqueue's error path. Here a status is a number until it is
//! named, by the driver itself when it can (`cuGetErrorName`), so every code, known or not,
//! becomes an [`Error::Cuda`] with its number. Enum out-parameters are read as `u32` for the
//! same reason. Only the functions the library calls are declared.

use crate::error::{Error, Result};
use cudarc::driver::sys::{
    cuuint64_t, CUatomicOperation, CUcontext, CUdevice, CUdevice_P2PAttribute, CUdevice_attribute, CUdeviceptr,
    CUfunction, CUfunction_attribute, CUgraph, CUgraphEdgeData, CUgraphNode, CUhostFn, CUipcMemHandle, CUlaunchConfig,
    CUmodule, CUpointer_attribute, CUstream, CUuserObject,
};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// `CUDA_SUCCESS`.
const SUCCESS: u32 = 0;
/// `CUDA_ERROR_NOT_FOUND`: a kernel name that a module does not define.
pub(crate) const ERROR_NOT_FOUND: u32 = 500;
/// `CUDA_ERROR_NOT_READY`: work still under way (`cuStreamQuery`).
pub(crate) const ERROR_NOT_READY: u32 = 600;
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
pub(crate) const ERROR_PEER_ACCESS_ALREADY_ENABLED: u32 = 704;

/// Whether a driver library can be loaded at all (cudarc's loader panics when none can).
pub(crate) fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the driver library.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

/// The driver's export `name` (NUL-terminated) as a function of type `F`, if the driver has it.
fn lookup<F: Copy>(name: &'static str) -> Option<F> {
    if !present() {
        return None;
    }
    // SAFETY: the library is present (culib does not panic); `F` is the C signature of `name`
    // in CUDA 13's cuda.h with the status read as u32 (an enum of C's unsigned int size).
    unsafe { cudarc::driver::sys::culib().get::<F>(name.as_bytes()) }.ok().map(|symbol| *symbol)
}

/// A status of `call` as a result: every code but success is an error carrying its number.
pub(crate) fn check(call: &'static str, status: u32) -> Result<()> {
    if status == SUCCESS {
        return Ok(());
    }
    Err(Error::Cuda { call, code: status, name: name_of(status) })
}

/// The driver's name for `code`, None when it has none (a code it does not know, or no driver).
fn name_of(code: u32) -> Option<&'static str> {
    type GetErrorName = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;
    static FUNCTION: OnceLock<Option<GetErrorName>> = OnceLock::new();
    let f = (*FUNCTION.get_or_init(|| lookup::<GetErrorName>("cuGetErrorName\0")))?;
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: a valid out-pointer; the driver accepts any code (an unknown one is an error).
    if unsafe { f(code, &mut name) } != SUCCESS || name.is_null() {
        return None;
    }
    // SAFETY: the driver's names are static NUL-terminated strings.
    unsafe { CStr::from_ptr(name) }.to_str().ok()
}

/// Declares each driver function as an `unsafe fn` of the same name and arguments returning
/// `Result<()>`: the status checked ([`check`]), a driver without the function
/// [`Error::DriverLacks`] (and no driver at all [`Error::NoDriver`]).
macro_rules! driver_functions {
    ($( $name:ident ( $($arg:ident : $ty:ty),* $(,)? ); )*) => {
        $(
            /// The driver's function of this name (cuda.h).
            ///
            /// # Safety
            /// The arguments must satisfy the driver's contract for it.
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub(crate) unsafe fn $name($($arg: $ty),*) -> Result<()> {
                type F = unsafe extern "C" fn($($ty),*) -> u32;
                static FUNCTION: OnceLock<Option<F>> = OnceLock::new();
                if !present() {
                    return Err(Error::NoDriver);
                }
                let f = FUNCTION
                    .get_or_init(|| lookup::<F>(concat!(stringify!($name), "\0")))
                    .ok_or(Error::DriverLacks(stringify!($name)))?;
                // SAFETY: the caller's contract; `f` has this signature (lookup).
                check(stringify!($name), unsafe { f($($arg),*) })
            }
        )*
    };
}

driver_functions! {
    cuInit(flags: c_uint);
    cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
    cuDeviceGetCount(count: *mut c_int);
    cuDeviceGetAttribute(value: *mut c_int, attribute: CUdevice_attribute, device: CUdevice);
    cuDeviceCanAccessPeer(can: *mut c_int, device: CUdevice, peer: CUdevice);
    cuDeviceGetP2PAttribute(value: *mut c_int, attribute: CUdevice_P2PAttribute, device: CUdevice, peer: CUdevice);
    cuDeviceGetName(name: *mut c_char, length: c_int, device: CUdevice);
    cuDeviceGetPCIBusId(bus_id: *mut c_char, length: c_int, device: CUdevice);
    cuDriverGetVersion(version: *mut c_int);
    cuDeviceGetP2PAtomicCapabilities(
        capabilities: *mut c_uint,
        operations: *const CUatomicOperation,
        count: c_uint,
        device: CUdevice,
        peer: CUdevice,
    );
    cuDevicePrimaryCtxRetain(context: *mut CUcontext, device: CUdevice);
    cuCtxGetDevice(device: *mut CUdevice);
    cuCtxPushCurrent_v2(context: CUcontext);
    cuCtxPopCurrent_v2(context: *mut CUcontext);
    cuCtxSynchronize();
    cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint);
    cuMemAlloc_v2(ptr: *mut CUdeviceptr, bytes: usize);
    cuMemFree_v2(ptr: CUdeviceptr);
    cuMemsetD8_v2(ptr: CUdeviceptr, value: u8, count: usize);
    cuMemsetD32_v2(ptr: CUdeviceptr, value: c_uint, count: usize);
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize, stream: CUstream);
    cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize);
    cuMemsetD8Async(ptr: CUdeviceptr, value: u8, count: usize, stream: CUstream);
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream);
    cuMemHostAlloc(ptr: *mut *mut c_void, bytes: usize, flags: c_uint);
    cuMemHostGetDevicePointer_v2(device: *mut CUdeviceptr, host: *mut c_void, flags: c_uint);
    cuMemFreeHost(ptr: *mut c_void);
    cuPointerGetAttributes(count: c_uint, attributes: *mut CUpointer_attribute, data: *mut *mut c_void, ptr: CUdeviceptr);
    cuIpcGetMemHandle(handle: *mut CUipcMemHandle, ptr: CUdeviceptr);
    cuIpcOpenMemHandle_v2(ptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint);
    cuIpcCloseMemHandle(ptr: CUdeviceptr);
    cuModuleLoadData(module: *mut CUmodule, image: *const c_void);
    cuModuleGetFunction(function: *mut CUfunction, module: CUmodule, name: *const c_char);
    cuFuncGetAttribute(value: *mut c_int, attribute: CUfunction_attribute, function: CUfunction);
    cuLaunchKernelEx(config: *const CUlaunchConfig, function: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void);
    cuStreamCreate(stream: *mut CUstream, flags: c_uint);
    cuStreamSynchronize(stream: CUstream);
    cuStreamQuery(stream: CUstream);
    cuStreamDestroy_v2(stream: CUstream);
    cuStreamIsCapturing(stream: CUstream, status: *mut u32);
    cuStreamGetCaptureInfo_v3(
        stream: CUstream,
        status: *mut u32,
        id: *mut cuuint64_t,
        graph: *mut CUgraph,
        dependencies: *mut *const CUgraphNode,
        edges: *mut *const CUgraphEdgeData,
        count: *mut usize,
    );
    cuUserObjectCreate(object: *mut CUuserObject, ptr: *mut c_void, destroy: CUhostFn, references: c_uint, flags: c_uint);
    cuUserObjectRelease(object: CUuserObject, count: c_uint);
    cuGraphRetainUserObject(graph: CUgraph, object: CUuserObject, count: c_uint, flags: c_uint);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_an_error_with_its_number_named_or_not() {
        assert!(check("cuTest", SUCCESS).is_ok());
        // 2 is CUDA_ERROR_OUT_OF_MEMORY; 987654 no driver lists. Without a driver neither is
        // named, with one the first is: both carry their number, and nothing panics.
        for code in [2u32, 987_654, u32::MAX] {
            let e = check("cuTest", code).unwrap_err();
            assert!(matches!(e, Error::Cuda { call: "cuTest", code: c, .. } if c == code), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(&code.to_string()) && text.contains("cuTest"), "{text}");
        }
        let unknown = check("cuTest", 987_654).unwrap_err().to_string();
        assert!(unknown.contains("which the driver does not name"), "{unknown}");
    }
}
