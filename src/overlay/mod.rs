//! The overlay: Edge-LLM's own plugin library (the *base*) loaded beside this one, so that the
//! one file Edge-LLM's runtime loads serves every plugin of the original, this library serving
//! `AllReducePlugin`.
//!
//! The base is, in this order: an Edge-LLM plugin library that registered `AllReducePlugin`
//! before this one was loaded (it is adopted, not loaded twice); `EDGELLM_ALLREDUCE_BASE_LIBRARY`
//! (a path; `none` turns the overlay off); `libNvInfer_edgellm_plugin_base.so` beside this
//! library (where `tools/install.sh` puts it). It is opened `RTLD_NOW | RTLD_LOCAL |
//! RTLD_NODELETE` when this library is loaded, so its static registrations fill TensorRT's
//! registry first and `cpp/registration.cpp` then replaces its `AllReducePlugin` creator with
//! ours, as [`policy`] decides. Its C exports are reached through the handle (never through the
//! global scope, where ours have the same names), and `abi` forwards Edge-LLM's C ABI to them.

pub(crate) mod policy;

use crate::error::{Error, Result};
use crate::loader;
use crate::log;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{c_char, c_int, c_void, OsStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The file name of the base when it is installed beside this library.
pub(crate) const BASE_FILE_NAME: &str = "libNvInfer_edgellm_plugin_base.so";
/// The setting that names the base (a path) or turns the overlay off (`none`).
pub(crate) const BASE_ENV: &str = "EDGELLM_ALLREDUCE_BASE_LIBRARY";

/// Edge-LLM's C ABI as the base exports it; each is absent where that Edge-LLM version lacks it.
#[derive(Default)]
pub(crate) struct BaseApi {
    pub init: Option<unsafe extern "C" fn(*mut c_void, *const c_char) -> bool>,
    pub register_nccl: Option<unsafe extern "C" fn(c_int, *mut c_void, *mut c_void) -> bool>,
    pub unregister_nccl: Option<unsafe extern "C" fn(c_int, *mut c_void) -> bool>,
    /// 0.11: `(deviceId, resourceId, weight, scale, outFeatures, inFeatures, scaleCols)`.
    pub register_nvfp4_weight:
        Option<unsafe extern "C" fn(i32, i32, *const c_void, *const c_void, i32, i32, i32) -> bool>,
    pub unregister_nvfp4_weight: Option<unsafe extern "C" fn(i32, i32) -> bool>,
    /// 0.10: `(nvinfer1::INetworkDefinition*, pagesPerSlot)`.
    pub dflash_configure_pages_per_slot: Option<unsafe extern "C" fn(*mut c_void, i32) -> bool>,
}

/// The loaded base.
pub(crate) struct Base {
    pub path: PathBuf,
    /// The base's load address: creators whose vtable lies in this object are the base's.
    pub address: usize,
    pub api: BaseApi,
    // Kept for the life of the process (the base is RTLD_NODELETE anyway: TensorRT holds its creators).
    _library: Library,
}

/// Where the base comes from.
#[derive(Debug, PartialEq, Eq)]
enum Source {
    Off,
    Preloaded(PathBuf),
    Configured(PathBuf),
    Beside(PathBuf),
    Missing(Option<PathBuf>),
}

/// The overlay's state: the base, or why there is none (for the errors of forwarded calls).
struct State {
    base: Option<Base>,
    absent: String,
}

static STATE: OnceLock<State> = OnceLock::new();

/// Finds and loads the base once per process (later calls return the first outcome).
/// `preloaded` is the file of an Edge-LLM library whose `AllReducePlugin` creator was registered
/// before ours. Logs one line: which base serves the other plugins, or why none does.
pub(crate) fn load(preloaded: Option<&Path>) -> Option<&'static Base> {
    STATE
        .get_or_init(|| {
            let own = loader::this_object();
            if own.as_ref().is_some_and(|(file, _)| is_the_program(file)) {
                // Linked into a program (the benchmark, the Rust tests), not loaded as the plugin
                // library a runtime names: there is no plugin file to stand in for.
                let why = "this library is linked into the program, not loaded as its plugin library: no overlay";
                log::verbose(why);
                return State { base: None, absent: why.to_owned() };
            }
            let setting = std::env::var_os(BASE_ENV);
            let beside = own.as_ref().and_then(|(file, _)| Some(file.parent()?.join(BASE_FILE_NAME)));
            let source = choose(setting.as_deref(), preloaded, beside);
            let outcome = open(&source, own.map_or(0, |(_, address)| address));
            match &outcome {
                Ok(base) => log::info(&format!(
                    "Edge-LLM's plugin library {} serves every plugin but AllReducePlugin, which this library serves",
                    base.path.display()
                )),
                Err(why) => match source {
                    Source::Off => log::info(why),
                    // Nothing installed: this library alone is a working install, said once.
                    Source::Missing(_) => log::warning(why),
                    // A base was named or installed and cannot serve: a configuration error.
                    _ => log::error(why),
                },
            }
            match outcome {
                Ok(base) => State { base: Some(base), absent: String::new() },
                Err(why) => State { base: None, absent: why },
            }
        })
        .base
        .as_ref()
}

/// The base, loading it if this library's initialiser has not (a process that links it statically).
pub(crate) fn base() -> Option<&'static Base> {
    load(None)
}

/// The base's export that `pick` selects, or an error naming `function` and why it is unavailable.
pub(crate) fn function<T>(function: &'static str, pick: impl FnOnce(&'static BaseApi) -> Option<T>) -> Result<T> {
    let why = match base() {
        Some(b) => match pick(&b.api) {
            Some(f) => return Ok(f),
            None => format!("{} does not export it (an Edge-LLM version without it)", b.path.display()),
        },
        None => STATE.get().map_or_else(String::new, |s| s.absent.clone()),
    };
    Err(Error::BaseUnavailable { function, why })
}

/// Makes this library's exports visible to `dlsym(RTLD_DEFAULT, ...)` even when the process
/// loaded it `RTLD_LOCAL` (Edge-LLM's C++ runtime resolves `edgellmRegisterNcclCommForAllReducePlugin`
/// and `edgellmRegisterFusedNvfp4WeightResource` that way), and keeps it loaded: TensorRT holds
/// its creators until the process ends.
pub(crate) fn promote_to_global_scope() {
    let Some((own, _)) = loader::this_object() else { return };
    match loader::already_loaded(&own, libc::RTLD_GLOBAL | libc::RTLD_NODELETE) {
        // The handle is never closed: the promotion and the reference are for the process's life.
        Some(handle) => std::mem::forget(handle),
        None => log::verbose(&format!("{} is not a loaded shared library: nothing to promote", own.display())),
    }
}

fn choose(setting: Option<&OsStr>, preloaded: Option<&Path>, beside: Option<PathBuf>) -> Source {
    let setting = setting.filter(|s| !s.is_empty());
    if setting == Some(OsStr::new("none")) {
        return Source::Off;
    }
    if let Some(path) = preloaded {
        return Source::Preloaded(path.to_owned());
    }
    match (setting, beside) {
        (Some(path), _) => Source::Configured(PathBuf::from(path)),
        (None, Some(path)) if path.exists() => Source::Beside(path),
        (None, looked) => Source::Missing(looked),
    }
}

/// Loads (or adopts) the base of `source`; the error says why there is none. `own` is this
/// library's load address, so that it is never its own base.
fn open(source: &Source, own: usize) -> std::result::Result<Base, String> {
    let (path, library) = match source {
        Source::Off => return Err(format!("{BASE_ENV}=none: the overlay is off, only AllReducePlugin is served")),
        Source::Missing(looked) => {
            let looked = looked.as_ref().map_or_else(String::new, |p| format!(" (looked for {})", p.display()));
            return Err(format!(
                "no Edge-LLM plugin library to serve the plugins other than AllReducePlugin{looked}: install one \
                 with tools/install.sh --base, or name it in {BASE_ENV} (none: serve AllReducePlugin alone)"
            ));
        }
        Source::Preloaded(path) => {
            let library = loader::already_loaded(path, libc::RTLD_NODELETE)
                .ok_or_else(|| format!("{} registered AllReducePlugin but is no longer loaded", path.display()))?;
            (path, library)
        }
        Source::Configured(path) | Source::Beside(path) => {
            if let Some(why) = not_a_library_file(path) {
                return Err(why);
            }
            if let (Some(needed), Some(loaded)) = (needed_tensorrt(path), loaded_tensorrt()) {
                if needed != loaded {
                    return Err(format!(
                        "Edge-LLM's plugin library {} is built for {needed}, but this process runs {loaded}: \
                         not loaded (it would bring a second TensorRT); only AllReducePlugin is served. Install \
                         the base for this TensorRT (tools/install.sh with EDGELLM_TRT_MAJOR)",
                        path.display()
                    ));
                }
            }
            // SAFETY: this runs the base's initialisers, Edge-LLM's static plugin registrations,
            // exactly as loading that library on its own would.
            let library =
                unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL | libc::RTLD_NODELETE) }.map_err(|e| {
                    // The loader's own words (dlerror) are the error's source.
                    let reason = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
                    format!(
                        "Edge-LLM's plugin library {} could not be loaded, only AllReducePlugin is served: {reason}",
                        path.display()
                    )
                })?;
            (path, library)
        }
    };
    let api = BaseApi::resolve(&library);
    let Some(init) = api.init else {
        return Err(format!("{} is not an Edge-LLM plugin library (it exports no initEdgellmPlugins)", path.display()));
    };
    // SAFETY: reading a symbol's address; `edgellmAllReduceCustomRanks` is this project's export.
    if unsafe { library.get::<*const c_void>(b"edgellmAllReduceCustomRanks\0") }.is_ok() {
        return Err(format!("{} is edgellm-allreduce, not Edge-LLM's own plugin library", path.display()));
    }
    let address = loader::object_of(init as usize).map_or(0, |(_, a)| a);
    if address == own {
        return Err(format!("{} is this library itself, not Edge-LLM's own plugin library", path.display()));
    }
    Ok(Base { path: path.clone(), address, api, _library: library })
}

/// Whether `file` (as the loader names an object) is the running program itself.
fn is_the_program(file: &Path) -> bool {
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    std::env::current_exe().ok().and_then(|exe| canonical(&exe)).is_some_and(|exe| canonical(file) == Some(exe))
}

/// Why `path` cannot be a base without even opening it: it is not there, or not a regular file
/// (a FIFO would block the loader, a device such as /dev/zero never ends, a directory is none).
fn not_a_library_file(path: &Path) -> Option<String> {
    // Opened (without blocking: a FIFO opens at once so) and asked through the descriptor, as
    // the loader will open it.
    match open_nonblocking(path).and_then(|f| f.metadata()) {
        Err(e) => Some(format!("Edge-LLM's plugin library {} cannot be read: {e}", path.display())),
        Ok(m) if !m.is_file() => Some(format!(
            "Edge-LLM's plugin library {} is not a regular file (a directory, FIFO, socket or device): not loaded, \
             only AllReducePlugin is served",
            path.display()
        )),
        Ok(_) => None,
    }
}

/// `path` opened for reading without blocking (a FIFO without a writer opens at once).
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)
}

/// The TensorRT runtime a library file needs (its `libnvinfer.so.N` DT_NEEDED entry), read
/// without loading it; None if it needs none or is not an ELF file.
fn needed_tensorrt(path: &Path) -> Option<String> {
    elf_needed(path)?.into_iter().find(|name| name.starts_with("libnvinfer.so."))
}

/// The DT_NEEDED names of a 64-bit little-endian ELF file (x86-64 and aarch64, the library's
/// targets), reading only its header, program headers, dynamic segment and the names: a few KiB
/// whatever the file's size, each read bounded. None for anything else, or a malformed file.
fn elf_needed(path: &Path) -> Option<Vec<String>> {
    use std::io::{Read, Seek, SeekFrom};
    const PT_LOAD: u32 = 1;
    const PT_DYNAMIC: u32 = 2;
    const DT_NEEDED: u64 = 1;
    const DT_STRTAB: u64 = 5;
    let mut file = open_nonblocking(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    // Up to `len` bytes at `offset` (fewer at the end of the file), and exactly `len`.
    fn read_upto(file: &mut std::fs::File, offset: u64, len: u64) -> Option<Vec<u8>> {
        let mut buffer = Vec::new();
        file.seek(SeekFrom::Start(offset)).ok()?;
        file.take(len).read_to_end(&mut buffer).ok()?;
        Some(buffer)
    }
    let mut read_at = |offset: u64, len: u64| read_upto(&mut file, offset, len).filter(|b| b.len() as u64 == len);
    let u16_at = |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |b: &[u8], at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
    let header = read_at(0, 64)?;
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None; // not ELF, not 64-bit, not little-endian
    }
    let (phoff, phentsize, phnum) =
        (u64_at(&header, 0x20)?, u16_at(&header, 0x36)? as u64, u16_at(&header, 0x38)? as u64);
    if !(56..=64).contains(&phentsize) || phnum == 0 || phnum > 256 {
        return None;
    }
    let phdrs = read_at(phoff, phentsize * phnum)?;
    // (type, file offset, virtual address, size in the file) of each program header.
    let segments: Vec<(u32, u64, u64, u64)> = (0..phnum as usize)
        .filter_map(|i| {
            let at = i * phentsize as usize;
            Some((u32_at(&phdrs, at)?, u64_at(&phdrs, at + 8)?, u64_at(&phdrs, at + 16)?, u64_at(&phdrs, at + 32)?))
        })
        .collect();
    let &(_, dyn_offset, _, dyn_size) = segments.iter().find(|s| s.0 == PT_DYNAMIC)?;
    let dynamic = read_at(dyn_offset, dyn_size.min(64 << 10))?;
    let entries: Vec<(u64, u64)> =
        dynamic.chunks_exact(16).map_while(|e| Some((u64_at(e, 0)?, u64_at(e, 8)?))).take_while(|e| e.0 != 0).collect();
    let strtab = entries.iter().find(|e| e.0 == DT_STRTAB)?.1;
    // The string table's file offset: through the loadable segment that holds its address.
    let &(_, load_offset, load_address, _) =
        segments.iter().find(|s| s.0 == PT_LOAD && s.2 <= strtab && strtab - s.2 < s.3)?;
    let strtab_offset = (strtab - load_address).checked_add(load_offset)?;
    let names = entries
        .iter()
        .filter(|e| e.0 == DT_NEEDED)
        .take(256)
        .filter_map(|&(_, name)| {
            // A library name is short: 256 bytes at most, or up to the end of the file.
            let bytes = read_upto(&mut file, strtab_offset.checked_add(name)?, 256)?;
            let end = bytes.iter().position(|&b| b == 0)?;
            Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
        })
        .collect();
    Some(names)
}

/// The TensorRT runtime already in the process, by soname (loaded globally or not).
fn loaded_tensorrt() -> Option<String> {
    ["libnvinfer.so.11", "libnvinfer.so.10"]
        .into_iter()
        .find(|soname| loader::already_loaded(Path::new(soname), 0).is_some())
        .map(str::to_owned)
}

impl BaseApi {
    fn resolve(library: &Library) -> BaseApi {
        fn get<T: Copy>(library: &Library, name: &[u8]) -> Option<T> {
            // SAFETY: `T` is the C signature Edge-LLM declares for `name`; the library stays
            // loaded for the process's life, so the copied pointer stays valid.
            unsafe { library.get::<T>(name) }.ok().map(|symbol| *symbol)
        }
        BaseApi {
            init: get(library, b"initEdgellmPlugins\0"),
            register_nccl: get(library, b"edgellmRegisterNcclCommForAllReducePlugin\0"),
            unregister_nccl: get(library, b"edgellmUnregisterNcclCommForAllReducePlugin\0"),
            register_nvfp4_weight: get(library, b"edgellmRegisterFusedNvfp4WeightResource\0"),
            unregister_nvfp4_weight: get(library, b"edgellmUnregisterFusedNvfp4WeightResource\0"),
            dflash_configure_pages_per_slot: get(library, b"edgellm_dflash_configure_pages_per_slot\0"),
        }
    }
}

#[cfg(test)]
mod tests;
