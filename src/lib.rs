//! edgellm-allreduce: a drop-in replacement for TensorRT-Edge-LLM's AllReduce plugin library.
//!
//! TensorRT talks to C++ (`cpp/`), C++ talks to Rust (the bridge below), Rust decides and
//! launches: `enqueue` → [`plugin::PluginCore::enqueue`] → [`strategy::choose`] → custom kernel,
//! NCCL or copy.
//!
//! | module | owns |
//! |---|---|
//! | [`abi`] | the C ABI (`edgellm*`, `initEdgellmPlugins`), forwarded to the overlay's base |
//! | `overlay` | Edge-LLM's own plugin library loaded beside this one (the base) |
//! | `loader` | what the dynamic loader knows: the file of an address, loaded libraries |
//! | [`registry`] | per-device NCCL registrations |
//! | [`fields`] | plugin fields: parse, validate, serialize |
//! | [`plugin`] | shapes, types, formats, enqueue dispatch |
//! | [`strategy`] | which path runs a call: copy, NCCL or a custom kernel family |
//! | [`workspace`] | per-rank workspaces, groups of ranks, peer access |
//! | [`kernels`] | the embedded CUDA kernels and their launch rule |
//! | [`kernel_images`] | which embedded image a GPU runs; what is said when none loads |
//! | [`communicator`] | what a registered NCCL communicator spans |
//! | [`tensor`] | TensorRT data types and descriptors |
//! | [`cuda`] | the CUDA driver through cudarc, dynamically loaded |
//! | [`nccl`] | calls through the registered `ncclAllReduce` |
//! | [`error`], [`log`] | the error type; logging through TensorRT's logger |

pub mod abi;
pub mod communicator;
pub mod cuda;
pub mod error;
pub mod fields;
pub mod kernel_images;
pub mod kernels;
mod loader;
pub mod log;
pub mod nccl;
mod overlay;
pub mod plugin;
pub mod registry;
pub mod strategy;
pub mod tensor;
pub mod workspace;

use error::{guard, Result};
use plugin::PluginCore;

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
        fn clone_box(self: &PluginCore) -> Box<PluginCore>;
        fn nb_inputs(self: &PluginCore) -> i32;
        fn nb_outputs(self: &PluginCore) -> i32;
        fn output_types_checked(self: &PluginCore, input_types: &[i32], output_types: &mut [i32]) -> Result<()>;
        fn output_shape_sources_checked(self: &PluginCore, inputs: &[TensorDesc], sources: &mut [i32]) -> Result<()>;
        fn supports_format(self: &PluginCore, pos: i32, in_out: &[TensorDesc], nb_inputs: i32) -> bool;
        fn configure_checked(self: &mut PluginCore, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()>;
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
        fn fields_to_serialize(self: &PluginCore) -> Vec<FieldValue>;

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

pub use ffi::TensorDesc;

// The bridge's Rust side: each function runs its body through `guard`, so a panic becomes an
// error, every error is logged once, and C++ sees a `rust::Error` it turns into a status code.

fn plugin_from_fields(raw: &[ffi::RawField]) -> Result<Box<PluginCore>> {
    guard("AllReducePlugin creation", || {
        let fields = raw.iter().map(incoming).collect::<Result<Vec<_>>>()?;
        PluginCore::from_fields(&fields).map(Box::new)
    })
}

/// Reads one TensorRT `PluginField` (borrowed for the duration of `createPlugin`).
fn incoming(f: &ffi::RawField) -> Result<fields::IncomingField<'_>> {
    if f.name == 0 {
        return Err(error::Error::invalid("a plugin field has a null name"));
    }
    // SAFETY: TensorRT's contract: `name` is a NUL-terminated string and `data` points to
    // `length` elements of `field_type`, both alive while createPlugin runs.
    let name = unsafe { std::ffi::CStr::from_ptr(f.name as *const std::ffi::c_char) }
        .to_str()
        .map_err(|_| error::Error::invalid("a plugin field name is not valid UTF-8"))?;
    let size = fields::element_size(f.field_type).unwrap_or(0);
    let bytes = match usize::try_from(f.length) {
        Ok(n) if f.data != 0 && size > 0 && n > 0 => {
            // SAFETY: as above; the length is bounded by what TensorRT allocated.
            unsafe { std::slice::from_raw_parts(f.data as *const u8, n * size) }
        }
        _ => &[],
    };
    Ok(fields::IncomingField { name, field_type: f.field_type, length: f.length, bytes })
}

fn plugin_with_tp_size(tp_size: i32) -> Result<Box<PluginCore>> {
    guard("AllReducePlugin creation", || PluginCore::new(fields::PluginConfig::with_tp_size(tp_size)?).map(Box::new))
}

impl PluginCore {
    fn clone_box(&self) -> Box<PluginCore> {
        Box::new(self.clone())
    }
    fn output_types_checked(&self, input_types: &[i32], output_types: &mut [i32]) -> Result<()> {
        guard("AllReducePlugin::getOutputDataTypes", || self.output_types(input_types, output_types))
    }
    fn output_shape_sources_checked(&self, inputs: &[TensorDesc], sources: &mut [i32]) -> Result<()> {
        guard("AllReducePlugin::getOutputShapes", || self.output_shape_sources(inputs, sources))
    }
    fn configure_checked(&mut self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        guard("AllReducePlugin::configurePlugin", || self.configure(inputs, outputs))
    }
    fn on_shape_change_checked(&mut self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        guard("AllReducePlugin::onShapeChange", || self.on_shape_change(inputs, outputs))
    }
    fn enqueue_checked(
        &self,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        input_ptrs: &[usize],
        output_ptrs: &[usize],
        stream: usize,
    ) -> Result<()> {
        guard("AllReducePlugin::enqueue", || self.enqueue(inputs, outputs, input_ptrs, output_ptrs, stream))
    }
    fn fields_to_serialize(&self) -> Vec<ffi::FieldValue> {
        self.serialized_fields().into_iter().map(field_value).collect()
    }
}

fn field_value(f: fields::OutgoingField) -> ffi::FieldValue {
    let length = if f.bytes.is_empty() { 0 } else { 1 };
    ffi::FieldValue { name: f.name.to_owned(), field_type: f.field_type, length, data: f.bytes }
}

fn creator_field_names() -> Vec<ffi::FieldValue> {
    fields::declared()
        .into_iter()
        .map(|f| ffi::FieldValue { length: 1, ..field_value(f) })
        .collect()
}

fn nccl_registration(device: i32) -> ffi::NcclRegistration {
    let r = registry::get(device);
    ffi::NcclRegistration { comm: r.map_or(0, |r| r.comm), all_reduce: r.map_or(0, |r| r.all_reduce) }
}

fn last_nccl_all_reduce() -> usize {
    registry::last_all_reduce()
}

fn log_error(message: &str) {
    log::error(message)
}
fn log_warning(message: &str) {
    log::warning(message)
}
fn log_info(message: &str) {
    log::info(message)
}

fn overlay_load(preloaded_library: &str) -> usize {
    let preloaded = (!preloaded_library.is_empty()).then(|| std::path::Path::new(preloaded_library));
    guard("loading Edge-LLM's plugin library", || Ok(overlay::load(preloaded).map_or(0, |b| b.address))).unwrap_or(0)
}

fn overlay_base_address() -> usize {
    guard("the overlay's base", || Ok(overlay::base().map_or(0, |b| b.address))).unwrap_or(0)
}

fn overlay_promote_to_global_scope() {
    let _ = guard("making the library's exports global", || {
        overlay::promote_to_global_scope();
        Ok(())
    });
}
