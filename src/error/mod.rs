//! One error type for the whole core, a leaf (the peer self-test's verdict is one of its
//! plain values, `selftest.rs`). Every entry
//! point from C or C++ converts it into a TensorRT status code (or `false`/null) after logging
//! it once; nothing unwinds across the ABI.

mod selftest;

pub use selftest::{SelfTestFailure, SelfTestKind, SelfTestProblem};
use thiserror::Error;

/// Everything that can go wrong in the plugin core.
#[derive(Debug, Error)]
pub enum Error {
    // Plugin fields (createPlugin).
    #[error("plugin field '{name}': {reason}")]
    Field { name: String, reason: String },

    #[error("unknown plugin field '{0}' (known fields: {1})")]
    UnknownField(String, String),

    #[error("required plugin field '{0}' is missing")]
    MissingField(&'static str),

    #[error("{0}")]
    RawField(&'static str),

    // The tensors TensorRT describes.
    #[error("AllReducePlugin takes {want_in} inputs and {want_out} outputs, {what}; got {got_in} inputs and {got_out} outputs")]
    TensorCount { want_in: usize, want_out: usize, got_in: usize, got_out: usize, what: &'static str },

    #[error("unsupported tensor type {0} (supported: kFLOAT=0, kHALF=1, kBF16=7)")]
    UnsupportedType(i32),

    #[error("tensor {index} has type {dtype}, the first input has {first}: all must match")]
    TypeMismatch { index: usize, dtype: i32, first: i32 },

    #[error("{0}")]
    Shape(String),

    #[error("null tensor address (inputs {inputs:x?}, outputs {outputs:x?})")]
    NullTensor { inputs: Vec<usize>, outputs: Vec<usize> },

    #[error("the fused residual + RMSNorm all-reduce needs 16-byte aligned tensors; not aligned: {0}")]
    Unaligned(String),

    // Registration (the C ABI).
    #[error("cannot register a communicator for negative CUDA device id {0}")]
    NegativeDevice(i32),

    #[error("cannot register device {device}: ncclComm ({comm:#x}) and ncclAllReduce ({all_reduce:#x}) must both be non-null")]
    NullRegistration { device: i32, comm: usize, all_reduce: usize },

    #[error("cannot unregister device {device}: communicator {comm:#x} is not the registered one ({registered:#x})")]
    OtherCommunicator { device: i32, comm: usize, registered: usize },

    #[error("no communicator is registered for device {0}")]
    NothingRegistered(i32),

    #[error("no NCCL communicator is registered for CUDA device {device}: call edgellmRegisterNcclCommForAllReducePlugin (or trt_edgellm::plugins::registerNcclCommForAllReducePlugin) for this device before running an engine with tp_size {tp_size}")]
    NotRegistered { device: i32, tp_size: i32 },

    #[error("libNamespace is not valid UTF-8")]
    NamespaceNotUtf8,

    #[error("TensorRT refused to register AllReducePlugin in namespace '{0}'")]
    RegistryRefused(String),

    // Groups and their workspaces.
    #[error("no custom kernels for {nranks} ranks (they exist for {supported:?})")]
    RankCount { nranks: i32, supported: &'static [i32] },

    #[error("two ranks on device {0}")]
    SharedDevice(i32),

    #[error("devices {0} and {1} have no peer access")]
    NoPeerAccess(i32, i32),

    #[error("rank {0} of this group is not driven by this process")]
    RankNotLocal(i32),

    #[error("the ranks did not agree on the custom all-reduce: {0}")]
    ExchangeRefused(String),

    #[error("device {device}: a custom all-reduce failed: {why}. Its group is retired: every all-reduce on this device fails until edgellmAllReduceReleaseWorkspaces (then NCCL) or edgellmAllReduceSetupWorkspaces (a new group) on every rank")]
    GroupFault { device: i32, why: &'static str },

    #[error("the group was released: its workspaces take no more launches")]
    Released,

    /// The peer self-test found the links between the group's GPUs broken (or a rank did not
    /// take part): the group must not run the custom kernels (`crate::group::selftest`).
    #[error("{0}")]
    SelfTest(Box<SelfTestFailure>),

    #[error("CUDA device ordinal {0} is out of range")]
    DeviceOrdinal(i32),

    #[error("the registered ncclAllReduce is not in a loaded NCCL library")]
    NotNccl,

    #[error("the NCCL library has no {0}")]
    NcclSymbol(&'static str),

    // Kernels, CUDA and NCCL.
    #[error("kernel {0} is not in the embedded modules")]
    NoKernel(String),

    /// Some kernel modules did not load on the device (docs/PLATFORMS.md): no group forms there.
    #[error("{0}")]
    KernelsUnavailable(String),

    #[error("the fused residual + RMSNorm all-reduce cannot run: {0}")]
    NormUnavailable(String),

    /// Arguments the link probe's kernels cannot take (`crate::launch::probe`).
    #[error("link probe: {0}")]
    Probe(String),

    #[error("the CUDA driver (libcuda.so.1) could not be loaded: a GPU and its driver are needed for this call")]
    NoDriver,

    /// The driver's `CUresult`: its number, any number, and its name when the driver has one
    /// (`cuda::driver`).
    #[error("CUDA call {call} failed with {}", match name {
        Some(name) => format!("{name} ({code})"),
        None => format!("CUDA error {code}, which the driver does not name"),
    })]
    Cuda { call: &'static str, code: u32, name: Option<&'static str> },

    #[error("the CUDA driver has no {0}: a newer driver is needed for this call")]
    DriverLacks(&'static str),

    /// An NCCL function returned `code`, named as nccl.h names it when it does.
    #[error("{function} failed with ncclResult_t {code}{}", nccl_result_name(*code).map(|n| format!(" ({n})")).unwrap_or_default())]
    Nccl { function: &'static str, code: i32 },

    #[error("a setup gather of {bytes} bytes does not fit the device's setup scratch of {capacity} bytes")]
    SetupScratch { bytes: usize, capacity: usize },

    #[error(
        "{function} is served by Edge-LLM's own plugin library (the overlay's base), which cannot serve it: {why}"
    )]
    BaseUnavailable { function: &'static str, why: String },

    #[error(
        "Edge-LLM's plugin library {path} refused {function}: neither library holds the change (they stay in step)"
    )]
    BaseRefused { function: &'static str, path: String },

    #[error("internal error (a Rust panic was caught at the API boundary): {0}")]
    Panic(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn field(name: &str, reason: impl Into<String>) -> Self {
        Error::Field { name: name.to_owned(), reason: reason.into() }
    }
    pub(crate) fn shape(reason: impl Into<String>) -> Self {
        Error::Shape(reason.into())
    }
}

/// Runs `f`, turning a panic into [`Error::Panic`] and logging any error once with `context`.
/// Every function reachable from C or C++ runs its body through this (or [`guard_or`]).
pub(crate) fn guard<T>(context: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        Err(Error::Panic(text))
    });
    if let Err(e) = &outcome {
        crate::log::error(&format!("{context}: {e}"));
    }
    outcome
}

/// [`guard`] for an entry point that cannot report an error: `fallback` after a panic (logged).
pub(crate) fn guard_or<T>(context: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    guard(context, || Ok(f())).unwrap_or(fallback)
}

/// nccl.h's name of an `ncclResult_t`.
fn nccl_result_name(code: i32) -> Option<&'static str> {
    const NAMES: [&str; 8] = [
        "ncclSuccess",
        "ncclUnhandledCudaError",
        "ncclSystemError",
        "ncclInternalError",
        "ncclInvalidArgument",
        "ncclInvalidUsage",
        "ncclRemoteError",
        "ncclInProgress",
    ];
    usize::try_from(code).ok().and_then(|i| NAMES.get(i).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_or_the_fallback() {
        let e = guard("test", || -> Result<()> { panic!("boom") }).unwrap_err();
        assert!(matches!(&e, Error::Panic(text) if text == "boom"), "{e}");
        assert_eq!(guard_or("test", -1, || panic!("boom")), -1);
        assert_eq!(guard_or("test", -1, || 7), 7);
    }

    #[test]
    fn cuda_errors_carry_their_number_and_the_drivers_name_if_any() {
        let named = Error::Cuda { call: "cuMemAlloc_v2", code: 2, name: Some("CUDA_ERROR_OUT_OF_MEMORY") };
        assert_eq!(named.to_string(), "CUDA call cuMemAlloc_v2 failed with CUDA_ERROR_OUT_OF_MEMORY (2)");
        let unnamed = Error::Cuda { call: "cuLaunchKernelEx", code: 12345, name: None };
        assert_eq!(
            unnamed.to_string(),
            "CUDA call cuLaunchKernelEx failed with CUDA error 12345, which the driver does not name"
        );
    }
}
