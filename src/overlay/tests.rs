use super::*;

fn os(s: &str) -> Option<&OsStr> {
    Some(OsStr::new(s))
}

#[test]
fn none_turns_the_overlay_off_whatever_else_is_there() {
    let pre = PathBuf::from("/pre/libNvInfer_edgellm_plugin.so");
    assert_eq!(choose(os("none"), Some(&pre), None), Source::Off);
}

#[test]
fn a_library_loaded_first_is_adopted_before_any_setting() {
    let pre = PathBuf::from("/pre/libNvInfer_edgellm_plugin.so");
    assert_eq!(choose(os("/elsewhere.so"), Some(&pre), None), Source::Preloaded(pre.clone()));
    assert_eq!(choose(None, Some(&pre), None), Source::Preloaded(pre));
}

#[test]
fn the_setting_comes_before_the_file_beside_and_empty_means_unset() {
    let dir = std::env::temp_dir().join(format!("overlay-choose-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let beside = dir.join(BASE_FILE_NAME);
    assert_eq!(choose(None, None, Some(beside.clone())), Source::Missing(Some(beside.clone())));
    std::fs::write(&beside, b"").unwrap();
    assert_eq!(choose(os("/b.so"), None, Some(beside.clone())), Source::Configured(PathBuf::from("/b.so")));
    assert_eq!(choose(os(""), None, Some(beside.clone())), Source::Beside(beside.clone()));
    assert_eq!(choose(None, None, None), Source::Missing(None));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_that_is_not_a_library_is_refused_with_the_loaders_message() {
    let dir = std::env::temp_dir().join(format!("overlay-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bogus = dir.join("libbogus.so");
    std::fs::write(&bogus, b"not an ELF file").unwrap();
    let why = open(&Source::Configured(bogus.clone()), 0).err().unwrap();
    assert!(why.contains(&bogus.display().to_string()) && why.contains("could not be loaded"), "{why}");
    let missing = open(&Source::Configured(dir.join("absent.so")), 0).err().unwrap();
    assert!(missing.contains("absent.so"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_library_without_edgellms_abi_is_not_a_base() {
    // libc is loaded in every process and exports no initEdgellmPlugins.
    let libc_path = loader::object_of(libc::malloc as *const () as usize).unwrap().0;
    let why = open(&Source::Configured(libc_path), 0).err().unwrap();
    assert!(why.contains("is not an Edge-LLM plugin library"), "{why}");
}

#[test]
fn the_tensorrt_a_library_needs_is_read_from_its_file() {
    // A library of this build's toolchain that needs no TensorRT, and a file that is no ELF.
    let libc_path = loader::object_of(libc::malloc as *const () as usize).unwrap().0;
    assert_eq!(needed_tensorrt(&libc_path), None);
    assert_eq!(needed_tensorrt(Path::new("/nonexistent/lib.so")), None);
}

#[test]
fn what_is_not_a_regular_file_is_refused_before_it_is_opened() {
    let dir = std::env::temp_dir().join(format!("overlay-kinds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("libfifo.so");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    // No reader, no writer: opening it for reading would block (the process, before main).
    for path in [fifo.as_path(), Path::new("/dev/zero"), dir.as_path()] {
        let why = open(&Source::Configured(path.to_owned()), 0).err().unwrap();
        assert!(why.contains("is not a regular file"), "{why}");
        assert_eq!(needed_tensorrt(path), None);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_large_file_is_read_only_where_its_headers_point() {
    let dir = std::env::temp_dir().join(format!("overlay-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A real library, then a hole up to 64 GiB: read whole, this would take the memory of
    // the machine.
    let libc_path = loader::object_of(libc::malloc as *const () as usize).unwrap().0;
    let real = std::fs::read(&libc_path).unwrap();
    let big = dir.join("libbig.so");
    let file = std::fs::File::create(&big).unwrap();
    use std::io::Write;
    (&file).write_all(&real).unwrap();
    file.set_len(1 << 36).unwrap();
    assert_eq!(elf_needed(&big), elf_needed(&libc_path), "the same names, from the headers only");
    let needed = elf_needed(&libc_path).unwrap();
    assert!(needed.iter().any(|n| n.starts_with("ld-linux")), "libc needs the dynamic loader: {needed:?}");
    // Truncated and garbage headers: no names, no panic.
    for len in [0, 3, 63, 64, 200, 4096] {
        let cut = dir.join(format!("libcut{len}.so"));
        std::fs::write(&cut, &real[..len.min(real.len())]).unwrap();
        let _ = elf_needed(&cut);
    }
    let mut garbage = real[..64].to_vec();
    garbage[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes()); // program headers "at" 2^64 - 1
    std::fs::write(dir.join("libgarbage.so"), &garbage).unwrap();
    assert_eq!(elf_needed(&dir.join("libgarbage.so")), None);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn linked_into_a_program_there_is_no_overlay() {
    // The unit tests link this code into their executable.
    assert!(is_the_program(&loader::this_object().unwrap().0));
    assert!(base().is_none());
    assert!(STATE.get().unwrap().absent.contains("linked into the program"));
    let libc_path = loader::object_of(libc::malloc as *const () as usize).unwrap().0;
    assert!(!is_the_program(&libc_path));
}

#[test]
fn off_and_missing_say_what_to_do() {
    assert!(open(&Source::Off, 0).err().unwrap().contains("none"));
    let why = open(&Source::Missing(Some(PathBuf::from("/x/base.so"))), 0).err().unwrap();
    assert!(why.contains("/x/base.so") && why.contains("tools/install.sh --base") && why.contains(BASE_ENV), "{why}");
}
