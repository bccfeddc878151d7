//! What a registered NCCL communicator spans (rank count, this rank, its device), asked of the
//! NCCL library that holds the registered `ncclAllReduce` (found with `dladdr`, opened with
//! `RTLD_NOLOAD`): never a second NCCL.

use super::Registration;
use crate::cuda;
use crate::error::{Error, Result};
use std::ffi::{c_int, c_void};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CommInfo {
    pub nranks: i32,
    pub rank: i32,
    pub device: i32,
}

/// `ncclCommCount`, `ncclCommUserRank`, `ncclCommCuDevice` of the registered communicator, or
/// None when they cannot be asked (the registered function is not NCCL's, or a call failed).
pub(crate) fn describe(registration: &Registration) -> Option<CommInfo> {
    type Query = unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int;
    let lib = crate::loader::library_of(registration.all_reduce)?;
    let ask = |name: &[u8]| -> Option<i32> {
        // SAFETY: these NCCL functions have the signature `ncclResult_t f(ncclComm_t, int*)`.
        let f = unsafe { lib.get::<Query>(name) }.ok()?;
        let mut value: c_int = -1;
        // SAFETY: the runtime registered a live communicator of this NCCL.
        (unsafe { f(registration.comm.raw(), &mut value) } == 0).then_some(value)
    };
    Some(CommInfo {
        nranks: ask(b"ncclCommCount\0")?,
        rank: ask(b"ncclCommUserRank\0")?,
        device: ask(b"ncclCommCuDevice\0")?,
    })
}

/// `ncclAllGather` of `mine` (the same length on every rank) over the registered communicator,
/// through its own NCCL library, in `scratch` (the device's: `crate::cuda::SetupScratch`). A
/// collective: every rank must call it, and it blocks until all have (setup time only). The
/// current context must be the rank's device.
pub(crate) fn all_gather(
    registration: &Registration,
    nranks: i32,
    mine: &[u8],
    scratch: &cuda::SetupScratch,
) -> Result<Vec<u8>> {
    type AllGather = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, *mut c_void, *mut c_void) -> c_int;
    const NCCL_UINT8: c_int = 1;
    let lib = crate::loader::library_of(registration.all_reduce).ok_or(Error::NotNccl)?;
    // SAFETY: ncclAllGather's C signature is AllGather.
    let all_gather =
        unsafe { lib.get::<AllGather>(b"ncclAllGather\0") }.map_err(|_| Error::NcclSymbol("ncclAllGather"))?;
    let n = mine.len();
    scratch.gather(mine, n * nranks.max(0) as usize, |stream, send, recv| {
        // SAFETY: send holds n bytes, recv n * nranks, on this device; the communicator is live.
        let code = unsafe {
            all_gather(send.as_const(), recv.as_mut(), n, NCCL_UINT8, registration.comm.raw(), stream.0 as *mut c_void)
        };
        match code {
            0 => Ok(()),
            code => Err(Error::Nccl { function: "ncclAllGather", code }),
        }
    })
}
