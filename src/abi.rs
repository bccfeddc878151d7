//! The C ABI of the library (cbindgen writes `include/edgellm_allreduce.h` from this file).
//! Every function is `noexcept` in spirit: errors are logged and reported as `false`, and a
//! panic never crosses this boundary.

use crate::error::{guard, Error};
use crate::registry::{self, Comm};
use crate::groups;
use std::ffi::{c_char, c_int, c_void, CStr};

/// Registers the NCCL communicator that AllReducePlugin instances running on CUDA device
/// `deviceId` use, and the address of `ncclAllReduce` from the NCCL library the runtime loaded.
/// Replaces an earlier registration of the same device. Returns false (and logs why) for a
/// negative device id or a null pointer.
#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn edgellmRegisterNcclCommForAllReducePlugin(
    deviceId: c_int,
    ncclComm: *mut c_void,
    ncclAllReduceFunction: *mut c_void,
) -> bool {
    guard("edgellmRegisterNcclCommForAllReducePlugin", || {
        registry::register(deviceId, Comm(ncclComm as usize), ncclAllReduceFunction as usize)?;
        // Forms the custom-kernel group once all of the communicator's ranks are registered here.
        groups::on_register(deviceId, registry::get(deviceId).expect("just registered"), false);
        Ok(())
    })
    .is_ok()
}

/// Removes the registration of `deviceId` if it holds exactly `ncclComm`. Returns false (and
/// logs why) otherwise.
#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn edgellmUnregisterNcclCommForAllReducePlugin(deviceId: c_int, ncclComm: *mut c_void) -> bool {
    guard("edgellmUnregisterNcclCommForAllReducePlugin", || {
        registry::unregister(deviceId, Comm(ncclComm as usize))?;
        groups::forget(deviceId);
        Ok(())
    })
    .is_ok()
}

/// Edge-LLM's plugin-library initializer. `logger` is an `nvinfer1::ILogger*` (or null): the
/// library logs through it from now on. Registers the AllReducePlugin creator with TensorRT's
/// plugin registry under `libNamespace` (null means "") unless it is registered there already.
/// Returns true unless that registration failed.
#[no_mangle]
#[allow(non_snake_case)]
// A C entry point: the pointer's contract is the C header's (null or NUL-terminated).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub extern "C" fn initEdgellmPlugins(logger: *mut c_void, libNamespace: *const c_char) -> bool {
    guard("initEdgellmPlugins", || {
        if !logger.is_null() {
            crate::ffi::set_logger(logger as usize);
        }
        let namespace = if libNamespace.is_null() {
            ""
        } else {
            // SAFETY: a non-null libNamespace is a NUL-terminated string (the C API contract).
            unsafe { CStr::from_ptr(libNamespace) }
                .to_str()
                .map_err(|_| Error::NamespaceNotUtf8)?
        };
        if crate::ffi::register_creator_in_namespace(namespace) {
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
    guard("edgellmAllReduceCustomRanks", || Ok(groups::group_for(deviceId).map_or(0, |(g, _)| g.nranks))).unwrap_or(0)
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
        let registration = registry::get(deviceId).ok_or(Error::NothingRegistered(deviceId))?;
        if groups::group_for(deviceId).is_none() {
            groups::on_register(deviceId, registration, true);
        }
        Ok(groups::group_for(deviceId).is_some())
    })
    .unwrap_or(false)
}

/// Releases the custom-kernel workspaces of the group `deviceId` belongs to (every rank of it
/// goes back to NCCL; the memory is freed once in-flight work is done). Call it on every rank's
/// device before tearing the runtime down if you do not unregister the communicators; unregister
/// does it too. Returns false when the device had no group.
#[no_mangle]
#[allow(non_snake_case)]
pub extern "C" fn edgellmAllReduceReleaseWorkspaces(deviceId: c_int) -> bool {
    guard("edgellmAllReduceReleaseWorkspaces", || {
        let had = groups::group_for(deviceId).is_some();
        groups::forget(deviceId);
        Ok(had)
    })
    .unwrap_or(false)
}
