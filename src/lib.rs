//! edgellm-allreduce: a drop-in replacement for TensorRT-Edge-LLM's AllReduce plugin library.
//!
//! TensorRT talks to C++ (`cpp/`), C++ talks to Rust (the bridge below, implemented in
//! `bridge.rs`), Rust decides and launches. One enqueue, in four files: `plugin.rs`
//! (`PluginCore::enqueue`: checks the tensors) → `strategy.rs` (`choose`: copy, NCCL or a kernel
//! family) → `launch.rs` (`Group::launch`: grid, block, parameters) → `cuda.rs`
//! (`cuLaunchKernelEx`).
//!
//! | module | owns |
//! |---|---|
//! | `bridge`, [`abi`] | the entry points: the cxx bridge's Rust side, the C ABI (`edgellm*`, `initEdgellmPlugins`), forwarded to the overlay's base |
//! | `overlay`, `loader` | Edge-LLM's own plugin library loaded beside this one (the base); what the dynamic loader knows |
//! | `plugin`, `io` | the plugin's decisions and enqueue dispatch; its tensors' counts, types, shapes, formats |
//! | `fields` | plugin fields: parse, validate, serialize |
//! | `strategy` | which path runs a call: copy, NCCL or a custom kernel family |
//! | `launch` | the launcher: fits, grid and block, parameters, launch |
//! | `family` | each kernel family described once: names, sync, fits and grid rules |
//! | `contract` | the kernels' constants and parameter blocks (cbindgen writes `kernels/ear_contract.h`) |
//! | `kernels` | the embedded kernels, loaded per device |
//! | `kernel_images` | which embedded image a GPU runs; what is said when none loads |
//! | `groups` | which devices form a group; the group table |
//! | `exchange` | the multi-process agreement (IPC handles through NCCL) |
//! | `group` | one group's memory: workspaces, state blocks, generation, retirement, its stream |
//! | `selftest` | the peer self-test a group passes before its custom kernels are trusted (`kernels/selftest.cu`) |
//! | `fault` | the kernels' fault words (a kernel that gave up waiting), read without synchronizing |
//! | `reclaim` | memory of released groups, freed at the runtime's setup and teardown calls |
//! | `registry` | per-device NCCL registrations |
//! | `communicator` | what a registered NCCL communicator spans |
//! | `config` | every environment knob, read once |
//! | `cuda`, `nccl`, `tensor`, `error`, `log` | leaves: the driver (`cuda/driver.rs` declares its functions, every status a number), the NCCL call, TensorRT types, errors, logging |
//!
//! The Rust API below (re-exported from those modules) is what the benchmark and the GPU tests
//! use; everything else is private to the crate.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod abi;
mod bridge;
mod communicator;
mod config;
mod contract;
mod cuda;
mod error;
mod exchange;
mod fault;
mod family;
mod fields;
mod group;
mod groups;
mod io;
mod kernel_images;
mod kernels;
mod launch;
mod loader;
mod log;
mod nccl;
mod overlay;
mod plugin;
mod reclaim;
mod registry;
mod selftest;
mod strategy;
mod tensor;

// The benchmark's and the GPU tests' API.
pub use cuda::{DevicePtr, Stream};
pub use error::{Error, Result};
pub use fault::Fault;
pub use family::{Family, RANK_COUNTS};
pub use ffi::TensorDesc;
pub use fields::{FusionOp, PluginConfig};
pub use group::{max_message_bytes, Group};
pub use groups::group_for;
#[doc(hidden)]
pub use groups::install_for_tests;
pub use kernels::{for_device as device_kernels, DeviceKernels, IMAGES as KERNEL_IMAGES};
pub use launch::{Fits, FusedCall, Message};
pub use nccl::dtype_code as nccl_dtype_code;
pub use plugin::PluginCore;
pub use reclaim::free_released_memory;
pub use selftest::{SelfTestFailure, SelfTestKind, SelfTestProblem};
#[doc(hidden)]
pub use selftest::{decide as self_test_decide, RankState, RankVerdict, SelfTestInjection, VERDICT_BYTES};
pub use strategy::{choose, requested, Call, Path, Requested};
pub use tensor::DataType;

use bridge::*;

/// The configuration (`crate::config`), what could not be parsed logged once.
pub(crate) fn config() -> &'static config::Config {
    static REPORTED: std::sync::Once = std::sync::Once::new();
    let config = config::get();
    REPORTED.call_once(|| config.problems.iter().for_each(|p| log::warning(p)));
    config
}

// The bridge: declarations only (three groups, as cxx's demo): shared structs, the Rust side
// (src/bridge.rs, every function behind the panic guard), the C++ side (cpp/registration.cpp).
#[cxx::bridge(namespace = "trt_edgellm::ffi")]
mod ffi {
    // Shared structs.

    /// A tensor as TensorRT describes it, flattened: `PluginTensorDesc` at run time,
    /// `DynamicPluginTensorDesc::desc` at build time, and `DimsExprs` in `getOutputShapes`
    /// (where a dimension that is not a build-time constant is -1).
    #[derive(Clone, Copy, Debug)]
    struct TensorDesc {
        nb_dims: i32,
        dims: [i64; 8],
        dtype: i32,
        format: i32,
    }

    /// A `PluginField` as TensorRT hands it to `createPlugin`; pointers as integers (cxx has no
    /// `void*`). `name` is a C string, `data` points to `length` elements of `field_type`.
    struct RawField {
        name: usize,
        data: usize,
        field_type: i32,
        length: i32,
    }

    /// A field to serialize, or to list in the creator's `getFieldNames` (with no data).
    struct FieldValue {
        name: String,
        field_type: i32,
        length: i32,
        data: Vec<u8>,
    }

    /// What is registered for one device; zeros when nothing is.
    struct NcclRegistration {
        comm: usize,
        all_reduce: usize,
    }

    extern "Rust" {
        type PluginCore;

        fn plugin_from_fields(fields: &[RawField]) -> Result<Box<PluginCore>>;
        fn plugin_with_tp_size(tp_size: i32) -> Result<Box<PluginCore>>;
        fn clone_box(self: &PluginCore) -> Result<Box<PluginCore>>;
        #[rust_name = "nb_inputs_checked"]
        fn nb_inputs(self: &PluginCore) -> i32;
        #[rust_name = "nb_outputs_checked"]
        fn nb_outputs(self: &PluginCore) -> i32;
        fn output_types_checked(self: &PluginCore, input_types: &[i32], output_types: &mut [i32]) -> Result<()>;
        fn output_shape_sources_checked(self: &PluginCore, inputs: &[TensorDesc], sources: &mut [i32]) -> Result<()>;
        #[rust_name = "supports_format_checked"]
        fn supports_format(self: &PluginCore, pos: i32, in_out: &[TensorDesc], nb_inputs: i32) -> bool;
        fn configure_checked(self: &mut PluginCore, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()>;
        #[rust_name = "workspace_size_checked"]
        fn workspace_size(self: &PluginCore) -> usize;
        fn on_shape_change_checked(self: &mut PluginCore, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()>;
        fn enqueue_checked(
            self: &PluginCore,
            inputs: &[TensorDesc],
            outputs: &[TensorDesc],
            input_ptrs: &[usize],
            output_ptrs: &[usize],
            stream: usize,
        ) -> Result<()>;
        fn fields_to_serialize(self: &PluginCore) -> Result<Vec<FieldValue>>;

        fn creator_field_names() -> Vec<FieldValue>;
        fn nccl_registration(device: i32) -> NcclRegistration;
        fn last_nccl_all_reduce() -> usize;
        fn log_error(message: &str);
        fn log_warning(message: &str);
        fn log_info(message: &str);

        /// The overlay (`overlay.rs`): runs once when the library is loaded, before our creator
        /// is registered. `preloaded_library` is the file of an Edge-LLM library whose
        /// AllReducePlugin was registered first ("" if none). Returns the base's load address
        /// (0: no base), by which the C++ side tells the base's creators from others.
        fn overlay_load(preloaded_library: &str) -> usize;
        fn overlay_base_address() -> usize;
        fn overlay_promote_to_global_scope();
    }

    unsafe extern "C++" {
        include!("edgellm-allreduce/cpp/bridge.h");

        /// Delivers a line to the TensorRT logger the process gave us; false when there is none.
        fn trt_log(severity: i32, message: &str) -> bool;
        /// Makes `logger` (an `nvinfer1::ILogger*`) the logger of this library.
        fn set_logger(logger: usize);
        /// Registers the creator with TensorRT's registry in `plugin_namespace` unless it is
        /// there already; true on success or when no registry is in the process.
        fn register_creator_in_namespace(plugin_namespace: &str) -> bool;
    }
}

