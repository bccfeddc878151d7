//! One error type for the whole core. Every entry point from C or C++ converts it into a
//! TensorRT status code (or `false`/null) after logging it once; nothing unwinds across the ABI.

use thiserror::Error;

/// Everything that can go wrong in the plugin core.
#[derive(Debug, Error)]
pub enum Error {
    #[error("plugin field '{name}': {reason}")]
    Field { name: String, reason: String },

    #[error("unknown plugin field '{0}' (known fields: {1})")]
    UnknownField(String, String),

    #[error("required plugin field '{0}' is missing")]
    MissingField(&'static str),

    #[error("{0}")]
    InvalidArgument(String),

    #[error("no NCCL communicator is registered for CUDA device {device}: call edgellmRegisterNcclCommForAllReducePlugin (or trt_edgellm::plugins::registerNcclCommForAllReducePlugin) for this device before running an engine with tp_size {tp_size}")]
    NotRegistered { device: i32, tp_size: i32 },

    #[error("the CUDA driver (libcuda.so.1) could not be loaded: a GPU and its driver are needed for this call")]
    NoDriver,

    #[error("CUDA call {call} failed with error {code}")]
    Cuda { call: &'static str, code: i32 },

    #[error("ncclAllReduce failed with ncclResult_t {0}")]
    Nccl(i32),

    #[error("{function} is served by Edge-LLM's own plugin library (the overlay's base), which cannot serve it: {why}")]
    BaseUnavailable { function: &'static str, why: String },

    #[error("Edge-LLM's plugin library {path} refused {function}")]
    BaseRefused { function: &'static str, path: String },

    #[error("internal error (a Rust panic was caught at the API boundary): {0}")]
    Panic(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn field(name: &str, reason: impl Into<String>) -> Self {
        Error::Field { name: name.to_owned(), reason: reason.into() }
    }
    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Error::InvalidArgument(reason.into())
    }
}

/// Runs `f`, turning a panic into [`Error::Panic`] and logging any error once with `context`.
/// Every function reachable from C or C++ runs its body through this.
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
