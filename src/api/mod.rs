//! The entry points: the cxx bridge to `cpp/` and the C ABI. Both convert what comes in to the
//! core's types and run every call behind the panic guard (`crate::error::guard`).

pub mod abi;
pub(crate) mod bridge;
