//! NVML, when the machine has it (`libnvidia-ml.so.1`, loaded at run time with libloading): what
//! the driver reports of peer-to-peer reads and writes between two GPUs
//! (`nvmlDeviceGetP2PStatus`, `NVML_P2P_CAPS_INDEX_READ` / `_WRITE`). Some platforms support
//! only peer writes (an NVIDIA engineer on Intel client CPUs, NVIDIA/open-gpu-kernel-modules#1253),
//! and there a peer load may never return. Optional: without NVML, or for a GPU it does not know,
//! nothing is known ([`P2p::UNKNOWN`]) and nothing changes.

use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::OnceLock;

/// What NVML says of peer accesses from one GPU to another: `Some(true)` supported,
/// `Some(false)` not, `None` unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2p {
    pub reads: Option<bool>,
    pub writes: Option<bool>,
}

impl P2p {
    pub const UNKNOWN: P2p = P2p { reads: None, writes: None };
}

type Device = *mut c_void;
type Init = unsafe extern "C" fn() -> c_int;
type ByBusId = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
type P2pStatus = unsafe extern "C" fn(Device, Device, c_uint, *mut c_uint) -> c_int;

/// `NVML_SUCCESS`, `NVML_P2P_STATUS_OK`, and the capability indices (nvml.h).
const SUCCESS: c_int = 0;
const STATUS_OK: c_uint = 0;
const CAPS_READ: c_uint = 0;
const CAPS_WRITE: c_uint = 1;

struct Nvml {
    by_bus_id: ByBusId,
    p2p_status: P2pStatus,
    _library: Library,
}

/// NVML, initialised once; None when the library or a function is missing or nvmlInit fails.
fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| {
        // SAFETY: loading NVML runs its initialisers, which have no preconditions.
        let library = unsafe { Library::new("libnvidia-ml.so.1") }.ok()?;
        // SAFETY: the C signatures of nvml.h.
        let (init, by_bus_id, p2p_status) = unsafe {
            (
                *library.get::<Init>(b"nvmlInit_v2\0").ok()?,
                *library.get::<ByBusId>(b"nvmlDeviceGetHandleByPciBusId_v2\0").ok()?,
                *library.get::<P2pStatus>(b"nvmlDeviceGetP2PStatus\0").ok()?,
            )
        };
        // SAFETY: no arguments; NVML counts its initialisations (it is never shut down here).
        (unsafe { init() } == SUCCESS).then_some(Nvml { by_bus_id, p2p_status, _library: library })
    })
    .as_ref()
}

/// NVML's peer read and write status from the GPU at PCI bus id `from` to the one at `to`.
pub fn p2p(from: &str, to: &str) -> P2p {
    let Some(nvml) = nvml() else { return P2p::UNKNOWN };
    let handle = |bus: &str| -> Option<Device> {
        let bus = CString::new(bus).ok()?;
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated bus id and a valid out-pointer.
        (unsafe { (nvml.by_bus_id)(bus.as_ptr(), &mut device) } == SUCCESS).then_some(device)
    };
    let (Some(a), Some(b)) = (handle(from), handle(to)) else { return P2p::UNKNOWN };
    let status = |index| {
        let mut status: c_uint = u32::MAX;
        // SAFETY: two handles NVML gave; a valid out-pointer; the status is read as a number.
        (unsafe { (nvml.p2p_status)(a, b, index, &mut status) } == SUCCESS).then_some(status == STATUS_OK)
    };
    P2p { reads: status(CAPS_READ), writes: status(CAPS_WRITE) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_nvml_or_a_gpu_nothing_is_known() {
        // No GPU here: NVML is missing, or knows no such bus id. Either way, nothing is claimed.
        assert_eq!(p2p("0000:00:00.0", "ffff:ff:1f.7"), P2p::UNKNOWN);
        assert_eq!(p2p("not a bus id\0", "x"), P2p::UNKNOWN);
    }
}
