//! The NCCL path: the registered `ncclAllReduce` is called through its address, so this library
//! never loads an NCCL of its own (a second NCCL in one process is a hazard).

pub(crate) mod communicator;

use crate::cuda::{DevicePtr, Stream};
use crate::error::{Error, Result};
use crate::tensor::DataType;
use std::ffi::c_void;

/// An `ncclComm_t` the runtime registered: opaque, owned by the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Comm(pub usize);

impl Comm {
    /// The handle NCCL's functions take.
    pub(crate) fn raw(self) -> *mut c_void {
        self.0 as *mut c_void
    }
}

/// What the runtime registered for one device. Both are opaque and owned by the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    pub comm: Comm,
    /// `ncclAllReduce` of the NCCL library the runtime loaded.
    pub all_reduce: usize,
}

/// `ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)`.
type AllReduceFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, i32, i32, *mut c_void, *mut c_void) -> i32;

/// `ncclSum`.
const SUM: i32 = 0;

/// `ncclDataType_t` codes. BF16 is 9 (`ncclBfloat16`); Edge-LLM 0.9.1 and 0.10 sent 10, which is
/// `ncclFloat8e4m3` in NCCL >= 2.24, a bug fixed in 0.11.
pub fn dtype_code(dtype: DataType) -> i32 {
    match dtype {
        DataType::Float => 7,
        DataType::Half => 6,
        DataType::Bf16 => 9,
    }
}

/// Enqueues `ncclAllReduce(input, output, count, dtype, ncclSum, comm, stream)`.
///
/// # Safety
/// `registration` must hold a live communicator and the address of `ncclAllReduce`; `input` and
/// `output` must be device buffers of `count` elements on the communicator's device, `stream` a
/// stream of that device.
pub(crate) unsafe fn all_reduce(
    registration: Registration,
    input: DevicePtr,
    output: DevicePtr,
    count: usize,
    dtype: DataType,
    stream: Stream,
) -> Result<()> {
    // SAFETY: the caller guarantees the address is ncclAllReduce, whose C signature is AllReduceFn.
    let f: AllReduceFn = unsafe { std::mem::transmute::<usize, AllReduceFn>(registration.all_reduce) };
    // SAFETY: the caller's buffers, communicator and stream.
    let code = unsafe {
        f(
            input.as_const(),
            output.as_mut(),
            count,
            dtype_code(dtype),
            SUM,
            registration.comm.raw(),
            stream.0 as *mut c_void,
        )
    };
    if code != 0 {
        return Err(Error::Nccl { function: "ncclAllReduce", code });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_match_nccl() {
        assert_eq!(dtype_code(DataType::Half), 6);
        assert_eq!(dtype_code(DataType::Float), 7);
        assert_eq!(dtype_code(DataType::Bf16), 9);
    }

    /// What the fake NCCL received: input, output, count, type, op, communicator, stream.
    type Args = (usize, usize, usize, i32, i32, usize, usize);
    static CALLS: std::sync::Mutex<Vec<Args>> = std::sync::Mutex::new(Vec::new());
    unsafe extern "C" fn fake(
        i: *const c_void,
        o: *mut c_void,
        n: usize,
        t: i32,
        op: i32,
        c: *mut c_void,
        s: *mut c_void,
    ) -> i32 {
        CALLS.lock().unwrap().push((i as usize, o as usize, n, t, op, c as usize, s as usize));
        if n == 13 {
            5
        } else {
            0
        }
    }

    #[test]
    fn calls_the_registered_function_with_edge_llm_arguments() {
        let r = Registration { comm: crate::group::device::Comm(0xc0), all_reduce: fake as *const () as usize };
        let (a, b, s) = (DevicePtr(0x10), DevicePtr(0x20), Stream(0x30));
        // SAFETY: the fake reads nothing.
        unsafe { all_reduce(r, a, b, 4096, DataType::Bf16, s) }.unwrap();
        assert_eq!(CALLS.lock().unwrap().last().copied(), Some((0x10, 0x20, 4096, 9, 0, 0xc0, 0x30)));
        // SAFETY: as above.
        let err = unsafe { all_reduce(r, a, b, 13, DataType::Half, s) }.unwrap_err();
        assert!(matches!(err, Error::Nccl { function: "ncclAllReduce", code: 5 }));
        assert_eq!(err.to_string(), "ncclAllReduce failed with ncclResult_t 5 (ncclInvalidUsage)");
    }
}
