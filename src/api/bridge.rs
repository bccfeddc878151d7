//! The cxx bridge (declared at the end of this file) and its Rust side. Every function runs its body through
//! the panic guard: a panic becomes an error (or, where C++ expects a plain value, a logged
//! fallback), every error is logged once, and C++ sees a `rust::Error` it turns into a status.

use crate::error::{guard, guard_or, Error, Result};
use crate::group::device;
use crate::plugin::fields::{self, IncomingField, OutgoingField};
use crate::plugin::PluginCore;
use crate::tensor::{self, Descs};
use crate::{log, overlay};
use ffi::{FieldValue, NcclRegistration, RawField, TensorDesc};

pub(crate) fn plugin_from_fields(raw: &[RawField]) -> Result<Box<PluginCore>> {
    guard("AllReducePlugin creation", || {
        let fields = raw.iter().map(incoming).collect::<Result<Vec<_>>>()?;
        PluginCore::from_fields(&fields).map(Box::new)
    })
}

/// Reads one TensorRT `PluginField` (borrowed for the duration of `createPlugin`).
fn incoming(f: &RawField) -> Result<IncomingField<'_>> {
    if f.name == 0 {
        return Err(Error::RawField("a plugin field has a null name"));
    }
    // SAFETY: TensorRT's contract: `name` is a NUL-terminated string and `data` points to
    // `length` elements of `field_type`, both alive while createPlugin runs.
    let name = unsafe { std::ffi::CStr::from_ptr(f.name as *const std::ffi::c_char) }
        .to_str()
        .map_err(|_| Error::RawField("a plugin field name is not valid UTF-8"))?;
    let size = fields::element_size(f.field_type).unwrap_or(0);
    let bytes = match usize::try_from(f.length) {
        Ok(n) if f.data != 0 && size > 0 && n > 0 => {
            // SAFETY: as above; the length is bounded by what TensorRT allocated.
            unsafe { std::slice::from_raw_parts(f.data as *const u8, n * size) }
        }
        _ => &[],
    };
    Ok(IncomingField { name, field_type: f.field_type, length: f.length, bytes })
}

pub(crate) fn plugin_with_tp_size(tp_size: i32) -> Result<Box<PluginCore>> {
    guard("AllReducePlugin creation", || PluginCore::new(fields::PluginConfig::with_tp_size(tp_size)?).map(Box::new))
}

/// TensorRT's tensor descriptions as the core's own, on the stack (enqueue allocates nothing).
fn core(descs: &[TensorDesc]) -> Result<Descs> {
    Descs::collect(descs, |d| tensor::TensorDesc { nb_dims: d.nb_dims, dims: d.dims, dtype: d.dtype, format: d.format })
}

impl PluginCore {
    pub(crate) fn clone_box(&self) -> Result<Box<PluginCore>> {
        guard("AllReducePlugin::clone", || Ok(Box::new(self.clone())))
    }
    pub(crate) fn nb_inputs_checked(&self) -> i32 {
        guard_or("AllReducePlugin::getNbInputs", -1, || self.nb_inputs())
    }
    pub(crate) fn nb_outputs_checked(&self) -> i32 {
        guard_or("AllReducePlugin::getNbOutputs", -1, || self.nb_outputs())
    }
    pub(crate) fn output_types_checked(&self, input_types: &[i32], output_types: &mut [i32]) -> Result<()> {
        guard("AllReducePlugin::getOutputDataTypes", || self.output_types(input_types, output_types))
    }
    pub(crate) fn output_shape_sources_checked(&self, inputs: &[TensorDesc], sources: &mut [i32]) -> Result<()> {
        guard("AllReducePlugin::getOutputShapes", || self.output_shape_sources(&core(inputs)?, sources))
    }
    pub(crate) fn supports_format_checked(&self, pos: i32, in_out: &[TensorDesc], nb_inputs: i32) -> bool {
        guard_or("AllReducePlugin::supportsFormatCombination", false, || {
            core(in_out).is_ok_and(|in_out| self.supports_format(pos, &in_out, nb_inputs))
        })
    }
    pub(crate) fn configure_checked(&mut self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        guard("AllReducePlugin::configurePlugin", || self.configure(&core(inputs)?, &core(outputs)?))
    }
    pub(crate) fn workspace_size_checked(&self) -> usize {
        guard_or("AllReducePlugin::getWorkspaceSize", 0, || self.workspace_size())
    }
    pub(crate) fn on_shape_change_checked(&mut self, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
        guard("AllReducePlugin::onShapeChange", || self.on_shape_change(&core(inputs)?, &core(outputs)?))
    }
    pub(crate) fn enqueue_checked(
        &self,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        input_ptrs: &[usize],
        output_ptrs: &[usize],
        stream: usize,
    ) -> Result<()> {
        guard("AllReducePlugin::enqueue", || {
            self.enqueue(&core(inputs)?, &core(outputs)?, input_ptrs, output_ptrs, stream)
        })
    }
    pub(crate) fn fields_to_serialize(&self) -> Result<Vec<FieldValue>> {
        guard("AllReducePlugin::getFieldsToSerialize", || {
            Ok(self.serialized_fields().into_iter().map(field_value).collect())
        })
    }
}

fn field_value(f: OutgoingField) -> FieldValue {
    let length = if f.bytes.is_empty() { 0 } else { 1 };
    FieldValue { name: f.name.to_owned(), field_type: f.field_type, length, data: f.bytes }
}

/// The creator's field list; empty (and logged) after a panic.
pub(crate) fn creator_field_names() -> Vec<FieldValue> {
    guard_or("AllReducePluginCreator::getFieldNames", Vec::new(), || {
        fields::declared().into_iter().map(|f| FieldValue { length: 1, ..field_value(f) }).collect()
    })
}

pub(crate) fn nccl_registration(device: i32) -> NcclRegistration {
    guard_or("getNcclRegistrationForDevice", NcclRegistration { comm: 0, all_reduce: 0 }, || {
        let r = device::registration(device);
        NcclRegistration { comm: r.map_or(0, |r| r.comm.0), all_reduce: r.map_or(0, |r| r.all_reduce) }
    })
}

pub(crate) fn last_nccl_all_reduce() -> usize {
    guard_or("getNcclAllReduceFunc", 0, device::last_all_reduce)
}

pub(crate) fn log_error(message: &str) {
    // A panic while logging an error must not become another error line: dropped.
    let _ = std::panic::catch_unwind(|| log::error(message));
}

pub(crate) fn log_warning(message: &str) {
    let _ = std::panic::catch_unwind(|| log::warning(message));
}

pub(crate) fn log_info(message: &str) {
    let _ = std::panic::catch_unwind(|| log::info(message));
}

// The overlay (src/overlay/), asked by cpp/registration.cpp when the library is loaded.

pub(crate) fn overlay_load(preloaded_library: &str) -> usize {
    // First of all: log lines go to TensorRT's logger (when the process gives one) from now on.
    log::install_sink(|severity, line| ffi::trt_log(severity as i32, line));
    // The library is being loaded: the environment is read now, and what it sets but does not
    // make sense is said now, also in a process that only builds engines (no all-reduce runs).
    guard_or("reading the EDGELLM_ALLREDUCE_* settings", (), || {
        crate::config::get();
    });
    let preloaded = (!preloaded_library.is_empty()).then(|| std::path::Path::new(preloaded_library));
    guard_or("loading Edge-LLM's plugin library", 0, || overlay::load(preloaded).map_or(0, |b| b.address))
}

pub(crate) fn overlay_base_address() -> usize {
    guard_or("the overlay's base", 0, || overlay::base().map_or(0, |b| b.address))
}

pub(crate) fn overlay_promote_to_global_scope() {
    guard_or("making the library's exports global", (), overlay::promote_to_global_scope)
}

// Names from the registry arrive as bytes: another library's file or creator name need not be
// UTF-8, and a `rust::Str` built from one would throw on the C++ side.
pub(crate) fn overlay_replaces_all_reduce(namespace: &str, owner_file: &[u8], owner_address: usize) -> bool {
    guard_or("deciding whose AllReducePlugin TensorRT sees", true, || {
        let file = String::from_utf8_lossy(owner_file);
        let r = overlay::policy::replace_all_reduce(namespace, &file, owner_address, overlay_base_address());
        log::log(r.severity, &r.line);
        r.replace
    })
}

pub(crate) fn overlay_is_base_creator(kind: &[u8], name: &[u8], owner_address: usize) -> bool {
    guard_or("telling the base's creators", false, || {
        let (kind, name) = (String::from_utf8_lossy(kind), String::from_utf8_lossy(name));
        overlay::policy::is_base_creator(&kind, &name, owner_address, overlay_base_address())
    })
}

pub(crate) fn overlay_mirrors_base_in(namespace: &str) -> bool {
    overlay::policy::mirrors_base_in(namespace)
}

// The bridge: declarations only (three groups, as cxx's demo): shared structs, the Rust side
// (this file, every function behind the panic guard), the C++ side (cpp/registration.cpp).
#[allow(unreachable_pub)] // cxx declares the bridge's items `pub`
#[cxx::bridge(namespace = "trt_edgellm::ffi")]
pub(crate) mod ffi {
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

        /// The overlay (`overlay/mod.rs`): runs once when the library is loaded, before our creator
        /// is registered. `preloaded_library` is the file of an Edge-LLM library whose
        /// AllReducePlugin was registered first ("" if none). Returns the base's load address
        /// (0: no base), by which the C++ side tells the base's creators from others.
        fn overlay_load(preloaded_library: &str) -> usize;
        fn overlay_base_address() -> usize;
        fn overlay_promote_to_global_scope();
        /// The registration policy (`overlay/policy.rs`); `cpp/registration.cpp` does what it
        /// decides. Whether to withdraw the registered AllReducePlugin creator of another library
        /// (file and load address) from `plugin_namespace` for ours; logs the replacement.
        fn overlay_replaces_all_reduce(plugin_namespace: &str, owner_file: &[u8], owner_address: usize) -> bool;
        /// Whether a registered creator (interface kind, plugin name, its code's library) is one
        /// of the base's that this library serves beside its own.
        fn overlay_is_base_creator(kind: &[u8], name: &[u8], owner_address: usize) -> bool;
        /// Whether the base's creators are registered by this library in `plugin_namespace`.
        fn overlay_mirrors_base_in(plugin_namespace: &str) -> bool;
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
