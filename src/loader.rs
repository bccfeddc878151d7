//! What the dynamic loader knows about the libraries in the process: which file holds an address,
//! and handles to libraries that are already loaded (never a second copy of one).

use libloading::os::unix::{Library, RTLD_LAZY};
use std::ffi::{c_void, CStr};
use std::path::PathBuf;

/// The file (as the loader opened it) and load address of the object that contains `address`.
pub(crate) fn object_of(address: usize) -> Option<(PathBuf, usize)> {
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; any address may be asked about.
    if unsafe { libc::dladdr(address as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    Some((PathBuf::from(path), info.dli_fbase as usize))
}

/// The file and load address of the object this code is linked into (this library, or a test
/// executable that links it statically).
pub(crate) fn this_object() -> Option<(PathBuf, usize)> {
    static ANCHOR: u8 = 0;
    object_of(&ANCHOR as *const u8 as usize)
}

/// A handle to the library at `path` if it is loaded already, with `flags` added (RTLD_GLOBAL,
/// RTLD_NODELETE) to those it was loaded with; None if it is not loaded.
pub(crate) fn already_loaded(path: &std::path::Path, flags: libc::c_int) -> Option<Library> {
    // SAFETY: RTLD_NOLOAD only returns a library that is already loaded: no initialiser runs.
    unsafe { Library::open(Some(path), RTLD_LAZY | libc::RTLD_NOLOAD | flags) }.ok()
}

/// The library already loaded in the process that defines the function at `address`.
pub(crate) fn library_of(address: usize) -> Option<Library> {
    already_loaded(&object_of(address)?.0, 0)
}
