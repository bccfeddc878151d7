//! NCCL, loaded at run time (`libnccl.so.2` or `--nccl-lib`): the communicators of real mode,
//! the direct `ncclAllReduce` rows, and the address the plugin is registered with. The library
//! is never unloaded (its proxy threads outlive any point where that would be safe).

use crate::gpu::Res;
use edgellm_allreduce::DataType;
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr};

type InitAll = unsafe extern "C" fn(*mut *mut c_void, c_int, *const c_int) -> c_int;
type AllReduce =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

pub struct Nccl {
    pub path: String,
    pub version: i32,
    init_all: InitAll,
    all_reduce: AllReduce,
    destroy: Destroy,
    error_string: Option<ErrorString>,
}

impl Nccl {
    /// Loads NCCL: `path`, else `libnccl.so.2` from the loader's path, else from the usual
    /// install locations (system, CUDA, conda, the `nvidia-nccl` Python wheels). Call after the
    /// NCCL_* environment settings are final.
    pub fn load(path: Option<&str>) -> Res<Nccl> {
        let candidates: Vec<String> = match path {
            Some(p) => vec![p.to_string()],
            None => std::iter::once("libnccl.so.2".to_string()).chain(search()).collect(),
        };
        let mut errors = Vec::new();
        let mut found = None;
        for name in &candidates {
            // SAFETY: loading NCCL runs its initializers, which have no preconditions.
            match unsafe { Library::new(name) } {
                Ok(lib) => {
                    found = Some((name.clone(), lib));
                    break;
                }
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        let (name, lib) = found.ok_or_else(|| {
            format!("cannot load NCCL ({}); give one with --nccl-lib", errors.first().cloned().unwrap_or_default())
        })?;
        let name = name.as_str();
        let lib: &'static Library = Box::leak(Box::new(lib));
        // SAFETY: the symbols have these C signatures in every NCCL 2.x.
        unsafe {
            let get = |sym: &str| -> Res<*const ()> {
                lib.get::<*const ()>(sym.as_bytes()).map(|s| *s).map_err(|e| format!("{name} has no {sym}: {e}"))
            };
            let version_fn: GetVersion = std::mem::transmute(get("ncclGetVersion")?);
            let mut version = 0;
            version_fn(&mut version);
            Ok(Nccl {
                path: name.to_string(),
                version,
                init_all: std::mem::transmute::<*const (), InitAll>(get("ncclCommInitAll")?),
                all_reduce: std::mem::transmute::<*const (), AllReduce>(get("ncclAllReduce")?),
                destroy: std::mem::transmute::<*const (), Destroy>(get("ncclCommDestroy")?),
                error_string: get("ncclGetErrorString").ok().map(|p| std::mem::transmute::<*const (), ErrorString>(p)),
            })
        }
    }

    fn check(&self, call: &str, code: c_int) -> Res<()> {
        if code == 0 {
            return Ok(());
        }
        let text = self
            .error_string
            // SAFETY: ncclGetErrorString returns a static string.
            .map(|f| unsafe { CStr::from_ptr(f(code)) }.to_string_lossy().into_owned())
            .unwrap_or_default();
        Err(format!("{call}: NCCL error {code} {text}"))
    }

    /// One communicator per device (`ncclCommInitAll`), rank r on `devices[r]`.
    pub fn init_all(&self, devices: &[i32]) -> Res<Vec<usize>> {
        let mut comms = vec![std::ptr::null_mut::<c_void>(); devices.len()];
        // SAFETY: comms has room for devices.len() handles.
        let code = unsafe { (self.init_all)(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr()) };
        self.check("ncclCommInitAll", code)?;
        Ok(comms.into_iter().map(|c| c as usize).collect())
    }

    /// `ncclAllReduce(input, output, count, dtype, ncclSum, comm, stream)`.
    ///
    /// # Safety
    /// Buffers of `count` elements on the communicator's device; `stream` of that device.
    pub unsafe fn all_reduce(
        &self,
        input: u64,
        output: u64,
        count: usize,
        dtype: DataType,
        comm: usize,
        stream: usize,
    ) -> Res<()> {
        let code = (self.all_reduce)(
            input as *const c_void,
            output as *mut c_void,
            count,
            edgellm_allreduce::nccl_dtype_code(dtype),
            0,
            comm as *mut c_void,
            stream as *mut c_void,
        );
        self.check("ncclAllReduce", code)
    }

    pub fn destroy(&self, comm: usize) -> Res<()> {
        // SAFETY: a communicator from init_all, no longer used.
        let code = unsafe { (self.destroy)(comm as *mut c_void) };
        self.check("ncclCommDestroy", code)
    }

    /// The address of `ncclAllReduce`, as a runtime registers it with the plugin library.
    pub fn all_reduce_address(&self) -> usize {
        self.all_reduce as usize
    }

    pub fn version_string(&self) -> String {
        let v = self.version;
        if v >= 10000 {
            format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
        } else {
            format!("{}.{}.{}", v / 1000, v / 100 % 10, v % 100)
        }
    }
}

/// libnccl.so.2 in the usual install locations.
fn search() -> Vec<String> {
    let mut dirs: Vec<std::path::PathBuf> = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/local/lib",
        "/usr/local/cuda/lib64",
        "/usr/local/nccl/lib",
        "/opt/nccl/lib",
    ]
    .iter()
    .map(Into::into)
    .collect();
    if let Ok(conda) = std::env::var("CONDA_PREFIX") {
        dirs.push(std::path::Path::new(&conda).join("lib"));
    }
    // Python wheels: <prefix>/lib/python3.X/{site,dist}-packages/nvidia/nccl/lib.
    let home = std::env::var("HOME").unwrap_or_default();
    for prefix in ["/usr/lib", "/usr/local/lib", "/opt/conda/lib", &format!("{home}/.local/lib")] {
        let Ok(entries) = std::fs::read_dir(prefix) else { continue };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python3") {
                for pkgs in ["site-packages", "dist-packages"] {
                    dirs.push(e.path().join(pkgs).join("nvidia/nccl/lib"));
                }
            }
        }
    }
    dirs.into_iter().map(|d| d.join("libnccl.so.2")).filter(|p| p.is_file()).map(|p| p.display().to_string()).collect()
}
