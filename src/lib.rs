//! edgellm-allreduce: a drop-in replacement for TensorRT-Edge-LLM's AllReduce plugin library.
//!
//! TensorRT talks to C++ (`cpp/`), C++ to Rust through the cxx bridge (`api/bridge.rs`), C
//! callers through the C ABI (`api/abi.rs`); Rust decides and launches. The rooms, each
//! importing only the rooms below it:
//!
//! | room | owns |
//! |---|---|
//! | `api` | the entry points: the cxx bridge (types converted to the core's at the edge), the C ABI (`edgellm*`, `initEdgellmPlugins`), every call behind the panic guard |
//! | `overlay` | Edge-LLM's own plugin library loaded beside this one (the base), and the policy of whose creator TensorRT sees (`overlay::policy`; `cpp/registration.cpp` carries it out) |
//! | `plugin` | TensorRT-facing decisions: fields, tensors, and what `enqueue` runs |
//! | `group` | devices and groups: the per-device record ([`group::device`]), which devices form a group and the multi-process exchange, the peer self-test a group passes before its kernels are trusted, a group's memory, faults, reclaimed memory; `Group::plan` and `Group::run` |
//! | `launch` | what a launch is: the families and their rules, the launch plan, the embedded kernels, AUTO's tables per link class and the tuning file (`launch::tuning`), the link probe's launches (`launch::probe`) |
//! | `link` | what carries the bytes between two ranks (same device, NVLink, PCIe, none), from the driver's P2P attributes |
//! | `contract`, `loader`, `cuda`, `nccl`, `nvml`, `config`, `fingerprint`, `tensor`, `error`, `log` | leaves: the host ↔ kernel contract (cbindgen writes `ear_contract.h` from it), what the dynamic loader knows, the driver (no contexts kept), NCCL, NVML's P2P status, every environment knob, the machine's fingerprint, tensor types, errors, logging (to a sink installed at start-up) |
//!
//! One enqueue, in five files: `cpp/allReducePlugin.cpp` (`AllReducePlugin::enqueue`) →
//! `plugin/mod.rs` (`PluginCore::enqueue`: checks the tensors, asks the device's group) →
//! `group/run.rs` (gathers the call's facts: group, stream claim, fault word; executes) →
//! `launch/plan.rs` (pure: path, family, kernel, grid, block, flags, from one C rule shared with
//! the kernel simulations) → `launch/launcher.rs` (`cuLaunchKernelEx`).
//!
//! The Rust API below (re-exported from those rooms) is what the benchmark and the GPU tests
//! use; everything else is private to the crate.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(unreachable_pub)]

mod api;
mod config;
mod contract;
mod cuda;
mod error;
mod fingerprint;
mod group;
mod launch;
mod link;
mod loader;
mod log;
mod nccl;
mod nvml;
mod overlay;
mod plugin;
mod tensor;

pub use api::abi;

// The benchmark's and the GPU tests' API.
pub use cuda::{DevicePtr, Stream};
pub use error::{Error, Result};
pub use error::{SelfTestFailure, SelfTestKind, SelfTestProblem};
pub use group::device::group_for;
pub use group::device::kernels as device_kernels;
pub use group::fault::Fault;
pub use group::reclaim::free_released_memory;
pub use group::{max_message_bytes, Group};
// The integration tests' hooks (the `test-hooks` feature: never in a release build).
#[cfg(feature = "test-hooks")]
pub use group::device::install_for_tests;
#[cfg(feature = "test-hooks")]
pub use group::selftest::{decide as self_test_decide, RankState, RankVerdict, SelfTestInjection, VERDICT_BYTES};
pub use launch::family::{Family, Op, RANK_COUNTS};
pub use launch::kernels::{DeviceKernels, IMAGES as KERNEL_IMAGES};
pub use launch::strategy::{builtin_grid_cap, builtin_tables, AutoTables, FusedChoice, NARROW_ROW};
pub use launch::strategy::{choose, Call, Path, Requested};
/// The tuning file's format: `edgellm-allreduce-bench tune` writes it, AUTO reads it.
pub mod tuning {
    /// The file this process loaded (the integration tests' hook).
    #[cfg(feature = "test-hooks")]
    pub use crate::launch::tuning::{active, active_fingerprint};
    pub use crate::launch::tuning::{
        library_id, Gpu, GridCap, Machine, RowWidth, Section, SectionKey, TunedOp, Tuning, FILE_NAME,
    };
}
pub use launch::{Fits, FusedCall, Message};
/// The link probe's kernels (`edgellm-allreduce-bench probe`): SM copies and dependent round
/// trips across a link (a peer's memory, mapped pinned host memory), on the caller's stream.
pub mod probe {
    pub use crate::launch::probe::{copy, latency, RoundTrip, RING_BYTES, THREADS};
}
pub use link::{describe as describe_links, group_class, pair_facts, query as link_facts, LinkClass, PairFacts};
pub use nccl::dtype_code as nccl_dtype_code;
pub use nvml::{p2p as nvml_p2p, P2p};
pub use plugin::fields::{FusionOp, PluginConfig};
pub use plugin::{requested, PluginCore};
pub use tensor::{DataType, TensorDesc};
