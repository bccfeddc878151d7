//! What the driver says of devices and the links between them: counts, names, bus ids,
//! properties, peer access and its attributes.

use super::{driver, with_context, Context};
use crate::error::{Error, Result};
use cudarc::driver::sys;

/// Enables access from `device`'s context (`context`) to the memory of `peer`'s (`peer_context`)
/// (idempotent). False when the hardware cannot (no NVLink/P2P path between the two).
pub(crate) fn enable_peer_access(device: i32, context: Context, peer: i32, peer_context: Context) -> Result<bool> {
    driver()?;
    let mut can: std::ffi::c_int = 0;
    // SAFETY: valid out-pointer; device ordinals are checked by the driver.
    unsafe { driver::cuDeviceCanAccessPeer(&mut can, device, peer) }?;
    if can == 0 {
        return Ok(false);
    }
    with_context(context, || {
        // SAFETY: peer_context is a retained context; the current context is device's.
        match unsafe { driver::cuCtxEnablePeerAccess(peer_context.raw(), 0) } {
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
pub(crate) struct P2pAttributes {
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
    pub access: Option<bool>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: Option<bool>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (lower is better).
    pub perf_rank: Option<i32>,
}

/// [`P2pAttributes`] of the link from `device` to `peer` (two distinct ordinals: the driver
/// rejects a device with itself).
pub(crate) fn p2p_attributes(device: i32, peer: i32) -> P2pAttributes {
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
pub(crate) fn driver_version() -> Result<i32> {
    driver()?;
    let mut version = 0;
    // SAFETY: a valid out-pointer.
    unsafe { driver::cuDriverGetVersion(&mut version) }?;
    Ok(version)
}

/// The product name of `device` ("NVIDIA H200").
pub(crate) fn device_name(device: i32) -> Result<String> {
    driver()?;
    let dev = device_handle(device)?;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `name.len()` bytes, NUL-terminated.
    unsafe { driver::cuDeviceGetName(name.as_mut_ptr(), name.len() as std::ffi::c_int, dev) }?;
    Ok(c_string(&name))
}

/// The PCI bus id of `device`, `domain:bus:device.function` in lower case ("0000:17:00.0").
pub(crate) fn pci_bus_id(device: i32) -> Result<String> {
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
pub(super) fn device_handle(device: i32) -> Result<sys::CUdevice> {
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

/// Number of CUDA devices this process sees.
pub(crate) fn device_count() -> Result<i32> {
    driver()?;
    let mut count = 0;
    // SAFETY: a valid out-pointer.
    unsafe { driver::cuDeviceGetCount(&mut count) }?;
    Ok(count)
}
