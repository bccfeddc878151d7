//! The C ABI of the library (cbindgen writes `include/edgellm_allreduce.h` from this file).
//! Every function is `noexcept` in spirit: errors are logged and reported as `false`, and a
//! panic never crosses this boundary.
//!
//! Edge-LLM's whole C ABI is here: the AllReduce functions are served by this library and also
//! forwarded to Edge-LLM's own library when the overlay has one (its other plugins, such as
//! `FusedNvfp4GemmAllReducePlugin`, read its own registry); the others are forwarded only.

use crate::error::{guard, Error, Result};
use crate::group::device::{self, Comm, Registration};
use crate::group::{formation, reclaim};
use crate::overlay;
use std::ffi::{c_char, c_int, c_void, CStr};

/// Calls the base's `function` when the overlay has a base that exports it: a refusal is an error.
fn forward(function: &'static str, call: impl FnOnce(&overlay::BaseApi) -> Option<bool>) -> Result<()> {
    match overlay::base() {
        Some(base) if call(&base.api) == Some(false) => {
            Err(Error::BaseRefused { function, path: base.path.display().to_string() })
        }
        _ => Ok(()),
    }
}

/// Registers the NCCL communicator that AllReducePlugin instances running on CUDA device
/// `deviceId` use, and the address of `ncclAllReduce` from the NCCL library the runtime loaded.
/// Replaces an earlier registration of the same device. With an overlay base (Edge-LLM's own
/// library, whose other plugins read its own registry) the two libraries stay in step: the
/// result is true when both hold the registration, false (and logged why) when neither does
/// (a negative device id or a null pointer, refused here; or the base refused it, and then
/// this library did not store it either).
/// # Safety
/// `ncclComm` and `ncclAllReduceFunction` must be a live communicator of `deviceId` and the
/// `ncclAllReduce` of the NCCL library that made it (or null: refused); they are used until
/// unregistered.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn edgellmRegisterNcclCommForAllReducePlugin(
    deviceId: c_int,
    ncclComm: *mut c_void,
    ncclAllReduceFunction: *mut c_void,
) -> bool {
    guard("edgellmRegisterNcclCommForAllReducePlugin", || {
        reclaim::free_released_memory();
        let registration = Registration { comm: Comm(ncclComm as usize), all_reduce: ncclAllReduceFunction as usize };
        // Ours checked first, the base asked next, ours stored last: both or neither.
        device::check_registration(deviceId, registration.comm, registration.all_reduce)?;
        forward("edgellmRegisterNcclCommForAllReducePlugin", |base| {
            // SAFETY: the base's function has this C signature; the arguments are the caller's.
            base.register_nccl.map(|f| unsafe { f(deviceId, ncclComm, ncclAllReduceFunction) })
        })?;
        device::register(deviceId, registration.comm, registration.all_reduce)?;
        // Forms the custom-kernel group once all of the communicator's ranks are registered
        // here. The registration stands whatever happens there (a failure leaves NCCL, logged).
        let _ = guard("forming the custom all-reduce group", || {
            formation::on_register(deviceId, registration, false);
            Ok(())
        });
        Ok(())
    })
    .is_ok()
}

/// Removes the registration of `deviceId` if it holds exactly `ncclComm`. Returns false (and
/// logs why) otherwise. The base (Edge-LLM's library, when the overlay has one) is asked too,
/// in step: true when both removed it, false when neither did (this library's registration
/// is kept when the base refuses).
/// # Safety
/// `ncclComm` is compared, not read; it may be any value.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn edgellmUnregisterNcclCommForAllReducePlugin(deviceId: c_int, ncclComm: *mut c_void) -> bool {
    guard("edgellmUnregisterNcclCommForAllReducePlugin", || {
        reclaim::free_released_memory();
        device::check_unregistration(deviceId, Comm(ncclComm as usize))?;
        forward("edgellmUnregisterNcclCommForAllReducePlugin", |base| {
            // SAFETY: the base's function has this C signature; the arguments are the caller's.
            base.unregister_nccl.map(|f| unsafe { f(deviceId, ncclComm) })
        })?;
        device::unregister(deviceId, Comm(ncclComm as usize))?;
        device::forget(deviceId);
        Ok(())
    })
    .is_ok()
}

/// Edge-LLM's plugin-library initializer. `logger` is an `nvinfer1::ILogger*` (or null): the
/// library logs through it from now on. Registers the AllReducePlugin creator with TensorRT's
/// plugin registry under `libNamespace` (null means "") unless it is registered there already,
/// replacing another library's AllReducePlugin there; with an overlay base, the base's own
/// initializer runs first and its other creators are registered in `libNamespace` too.
/// Returns true unless the registration of AllReducePlugin failed (upstream always returns true).
/// # Safety
/// `logger` must be null or an `nvinfer1::ILogger*` that outlives the library's use of it;
/// `libNamespace` null or a NUL-terminated string.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn initEdgellmPlugins(logger: *mut c_void, libNamespace: *const c_char) -> bool {
    guard("initEdgellmPlugins", || {
        if !logger.is_null() {
            crate::api::bridge::ffi::set_logger(logger as usize);
        }
        let namespace = if libNamespace.is_null() {
            ""
        } else {
            // SAFETY: a non-null libNamespace is a NUL-terminated string (the C API contract).
            unsafe { CStr::from_ptr(libNamespace) }.to_str().map_err(|_| Error::NamespaceNotUtf8)?
        };
        if let Some(init) = overlay::base().and_then(|b| b.api.init) {
            // SAFETY: Edge-LLM's initializer has this signature and takes the caller's arguments
            // (it copies the log level of an Edge-LLM logger and returns true).
            unsafe { init(logger, libNamespace) };
        }
        if crate::api::bridge::ffi::register_creator_in_namespace(namespace) {
            Ok(())
        } else {
            Err(Error::RegistryRefused(namespace.to_owned()))
        }
    })
    .is_ok()
}

/// How many ranks the custom-kernel group of CUDA device `deviceId` has: 0 when the device has
/// none, and its all-reduces use NCCL. A group forms by itself when every rank of a registered
/// communicator is registered in this process (single-process multi-GPU).
#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn edgellmAllReduceCustomRanks(deviceId: c_int) -> c_int {
    guard("edgellmAllReduceCustomRanks", || Ok(device::group_for(deviceId).map_or(0, |(g, _)| g.nranks))).unwrap_or(0)
}

/// Sets up the custom-kernel workspaces of the communicator registered for `deviceId`, for
/// runtimes that choose the moment themselves. When every rank of the communicator is registered
/// in this process, this forms the group without blocking (as registration does). Otherwise it
/// is a collective over the communicator (IPC handles exchanged through its NCCL): every rank
/// must call it, each from its own thread or process, and it returns when all have; all ranks
/// get the group or none does. Returns whether the device has a group afterwards.
#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn edgellmAllReduceSetupWorkspaces(deviceId: c_int) -> bool {
    guard("edgellmAllReduceSetupWorkspaces", || {
        reclaim::free_released_memory();
        let registration = device::registration(deviceId).ok_or(Error::NothingRegistered(deviceId))?;
        if device::group_for(deviceId).is_none() {
            formation::on_register(deviceId, registration, true);
        }
        Ok(device::group_for(deviceId).is_some())
    })
    .unwrap_or(false)
}

/// Why the last custom all-reduce on CUDA device `deviceId` failed, if one did since the
/// device's group formed: 0 none; 1 (`EAR_FAULT_TIMEOUT`) a kernel waited for a peer rank longer
/// than `EDGELLM_ALLREDUCE_TIMEOUT_MS` and gave up (a rank did not launch its part of a call);
/// 2 (`EAR_FAULT_ABORTED`) a kernel found its group aborted by a peer that gave up, and did not
/// run; 3 (`EAR_FAULT_RELEASED`) a kernel of a released group ran (a CUDA graph captured before
/// the release was replayed) and did not run. Whatever the code, that call's outputs are NaN
/// (every element: a failed call never looks like a result, though its stream shows no error),
/// and after 1 or 2 the device's all-reduces fail until `edgellmAllReduceReleaseWorkspaces`
/// (then NCCL) or `edgellmAllReduceSetupWorkspaces` on every rank. The kernels write the code
/// into host memory: this reads it without synchronizing, at any time (e.g. after a stream
/// synchronization, or between CUDA graph replays). -1 for a negative or too large device id.
#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn edgellmAllReduceLastError(deviceId: c_int) -> c_int {
    guard("edgellmAllReduceLastError", || {
        if !(0..device::MAX_DEVICES).contains(&deviceId) {
            return Err(Error::DeviceOrdinal(deviceId));
        }
        Ok(device::last_fault(deviceId).map_or(0, |r| r.fault.code() as c_int))
    })
    .unwrap_or(-1)
}

/// Releases the custom-kernel workspaces of the group `deviceId` belongs to: every rank of it
/// in this process goes back to NCCL, after its devices finished their work. Call it on every
/// rank's device at the same point of the call sequence (before tearing the runtime down if you
/// do not unregister the communicators, which does it too; after a failure, to go on with NCCL).
/// A CUDA graph captured before keeps the memory until it is destroyed; a replay then only
/// fills its outputs with NaN and reports fault 3 (`edgellmAllReduceLastError`). The memory is
/// freed at the next registration, unregistration, setup or release call after the last such
/// graph is destroyed.
/// Returns false when the device had no group.
#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn edgellmAllReduceReleaseWorkspaces(deviceId: c_int) -> bool {
    guard("edgellmAllReduceReleaseWorkspaces", || {
        reclaim::free_released_memory();
        Ok(device::forget(deviceId))
    })
    .unwrap_or(false)
}

/// Edge-LLM 0.11's registration of the NVFP4 weights a `FusedNvfp4GemmAllReducePlugin` layer
/// uses (a plugin of Edge-LLM's own library): forwarded to the overlay's base. Returns false
/// (and logs why) when there is no base or it does not export this function, as upstream
/// returns false for a registration it cannot take.
/// # Safety
/// As Edge-LLM's function of that name (its base receives the pointers unread here): device
/// buffers of the described sizes that outlive the registration.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn edgellmRegisterFusedNvfp4WeightResource(
    deviceId: i32,
    resourceId: i32,
    weight: *const c_void,
    scale: *const c_void,
    outFeatures: i32,
    inFeatures: i32,
    scaleCols: i32,
) -> bool {
    const NAME: &str = "edgellmRegisterFusedNvfp4WeightResource";
    guard(NAME, || {
        let f = overlay::function(NAME, |base| base.register_nvfp4_weight)?;
        // SAFETY: the base's function has this C signature; the arguments are the caller's.
        Ok(unsafe { f(deviceId, resourceId, weight, scale, outFeatures, inFeatures, scaleCols) })
    })
    .unwrap_or(false)
}

/// Edge-LLM 0.11's removal of a weight resource: forwarded to the overlay's base; false (and a
/// log line) without one.
#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn edgellmUnregisterFusedNvfp4WeightResource(deviceId: i32, resourceId: i32) -> bool {
    const NAME: &str = "edgellmUnregisterFusedNvfp4WeightResource";
    guard(NAME, || {
        let f = overlay::function(NAME, |base| base.unregister_nvfp4_weight)?;
        // SAFETY: the base's function has this C signature; the arguments are the caller's.
        Ok(unsafe { f(deviceId, resourceId) })
    })
    .unwrap_or(false)
}

/// Edge-LLM 0.10's builder hook: sets `pagesPerSlot` on the `DFlashTargetKVCacheUpdate` layers
/// of `network` (an `nvinfer1::INetworkDefinition*`). Forwarded to the overlay's base; false (and
/// a log line) without one or when the base does not export it (0.11), which is what upstream
/// returns when no such layer is found.
/// # Safety
/// `network` must be an `nvinfer1::INetworkDefinition*` of the running TensorRT (the base reads it).
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn edgellm_dflash_configure_pages_per_slot(network: *mut c_void, pagesPerSlot: i32) -> bool {
    const NAME: &str = "edgellm_dflash_configure_pages_per_slot";
    guard(NAME, || {
        let f = overlay::function(NAME, |base| base.dflash_configure_pages_per_slot)?;
        // SAFETY: the base's function has this C signature; the arguments are the caller's.
        Ok(unsafe { f(network, pagesPerSlot) })
    })
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    /// build.rs generates the C ABI header into OUT_DIR; the committed (and installed) copy must
    /// be the same text.
    #[test]
    fn the_committed_c_header_is_the_generated_one() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/edgellm_allreduce.h"));
        assert!(
            generated == include_str!("../../include/edgellm_allreduce.h"),
            "include/edgellm_allreduce.h is stale: rebuild with EDGELLM_WRITE_GENERATED=1 to rewrite it from src/api/abi.rs"
        );
    }
}
