//! Builds what the Rust core links or embeds:
//!   1. every `kernels/*.cu` with nvcc into a fatbin embedded in the library (`$OUT_DIR/kernels.rs`);
//!   2. the C ABI header `include/edgellm_allreduce.h` with cbindgen (rewritten only when it changes);
//!   3. the C++ TensorRT adapter (`cpp/*.cpp`) and the cxx bridge, as a whole archive.
//!
//! Before them, `kernels/ear_contract.h` (the kernels' constants and parameter blocks) is written
//! by cbindgen from `src/contract.rs`, so Rust and CUDA read one definition.
//!
//! Toolchain: `CUDA_HOME` (nvcc and CUDA headers) and `EDGELLM_TRT_INCLUDE` (TensorRT headers) or
//! `TRT_ROOT`; when they are unset, what `eval "$(tools/setup.sh)"` installed (CUDA 13.0 from
//! PyPI, TensorRT headers from the trtx-sys crate's sources). The build only looks for them: it
//! never installs anything. `EDGELLM_CUDA_ARCHS` chooses the SASS targets (default
//! "80;86;89;90;100;120", plus PTX of the newest).

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "80;86;89;90;100;120";

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in ["CUDA_HOME", "EDGELLM_TRT_INCLUDE", "TRT_ROOT", "EDGELLM_CUDA_ARCHS", "EDGELLM_TOOLCHAIN_DIR", "XDG_CACHE_HOME"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let toolchain = Toolchain::find();

    write_kernel_contract(&root);
    compile_kernels(&root, &out, &toolchain);
    write_c_header(&root);
    // The host half of the kernel contract (workspace layout, launch rule) from its own header.
    cc::Build::new().file(root.join("kernels/layout.c")).include(root.join("kernels")).compile("edgellm_kernel_layout");
    println!("cargo:rerun-if-changed=kernels/layout.c");

    let cpp: Vec<PathBuf> = sorted_files(&root.join("cpp"), "cpp");
    cxx_build::bridge("src/lib.rs")
        .files(&cpp)
        .include(root.join("include"))
        // -isystem: the TensorRT and CUDA headers are not ours to warn about.
        .flag("-isystem")
        .flag(toolchain.trt_include.to_str().expect("UTF-8 path"))
        .flag("-isystem")
        .flag(toolchain.cuda_home.join("include").to_str().expect("UTF-8 path"))
        .std("c++17")
        .flag("-fvisibility=hidden")
        .flag("-fvisibility-inlines-hidden")
        .flag_if_supported("-Wno-deprecated-declarations")
        .link_lib_modifier("+whole-archive")
        .compile("edgellm_allreduce_cpp");
    println!("cargo:rustc-link-lib=dl");
    for path in cpp.iter().chain(sorted_files(&root.join("include/trt_edgellm/plugins"), "h").iter()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed=cpp/bridge.h");
    println!("cargo:rerun-if-changed=src/abi.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}

struct Toolchain {
    cuda_home: PathBuf,
    trt_include: PathBuf,
}

impl Toolchain {
    /// CUDA_HOME and EDGELLM_TRT_INCLUDE (or TRT_ROOT), else what `tools/setup.sh` installed in
    /// the toolchain cache, else nvcc on PATH. Finds, never installs: a build (an IDE's too) must
    /// not change the machine, so a missing piece stops it with the command that installs it.
    fn find() -> Self {
        let cache = toolchain_cache();
        let cuda_home = env::var_os("CUDA_HOME")
            .map(PathBuf::from)
            .or_else(|| newest_dir(&cache, "cuda-", "nvidia/cu13/bin/nvcc").map(|d| d.join("nvidia/cu13")))
            .or_else(nvcc_on_path)
            .unwrap_or_else(|| missing("the CUDA compiler (nvcc)", "CUDA_HOME"));
        let trt_include = env::var_os("EDGELLM_TRT_INCLUDE")
            .map(PathBuf::from)
            .or_else(|| env::var_os("TRT_ROOT").map(|r| PathBuf::from(r).join("include")))
            .or_else(|| newest_dir(&cache, "trt-10.", "NvInferRuntime.h"))
            .unwrap_or_else(|| missing("the TensorRT 10 headers", "EDGELLM_TRT_INCLUDE (or TRT_ROOT)"));
        if !cuda_home.join("bin/nvcc").exists() {
            missing(&format!("nvcc under {}", cuda_home.display()), "CUDA_HOME");
        }
        if !trt_include.join("NvInferRuntime.h").exists() {
            missing(&format!("NvInferRuntime.h in {}", trt_include.display()), "EDGELLM_TRT_INCLUDE");
        }
        Toolchain { cuda_home, trt_include }
    }
}

/// Where tools/setup.sh installs the toolchain.
fn toolchain_cache() -> PathBuf {
    env::var_os("EDGELLM_TOOLCHAIN_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let cache = env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env::var_os("HOME").unwrap_or_default()).join(".cache"));
        cache.join("edgellm-allreduce")
    })
}

/// The last (by name) folder of `dir` named `prefix*` that holds `file`.
fn newest_dir(dir: &Path, prefix: &str, file: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)) && p.join(file).exists())
        .collect();
    found.sort();
    found.pop()
}

fn nvcc_on_path() -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?).find(|d| d.join("nvcc").is_file()).and_then(|bin| bin.parent().map(Path::to_path_buf))
}

fn missing(what: &str, variable: &str) -> ! {
    panic!(
        "{what} not found. Set {variable}, or install the toolchain into {} with\n    eval \"$(tools/setup.sh)\"\n(the CUDA 13.0 compiler from PyPI, TensorRT headers from the trtx-sys crate; cmake and GoogleTest from apt)",
        toolchain_cache().display()
    )
}

fn sorted_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == ext)).collect())
        .unwrap_or_default();
    files.sort();
    files
}

/// nvcc each kernel file into a fatbin and write `kernels.rs`: `MODULES: &[(name, fatbin)]`.
fn compile_kernels(root: &Path, out: &Path, toolchain: &Toolchain) {
    let archs = env::var("EDGELLM_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_owned());
    let archs: Vec<&str> = archs.split([';', ',', ' ']).filter(|a| !a.is_empty()).collect();
    let newest = archs.iter().copied().max_by_key(|a| a.parse::<u32>().unwrap_or(0)).expect("EDGELLM_CUDA_ARCHS is empty");
    let nvcc = toolchain.cuda_home.join("bin/nvcc");
    let kernels_dir = root.join("kernels");
    println!("cargo:rerun-if-changed={}", kernels_dir.display());
    for header in sorted_files(&kernels_dir, "cuh").iter().chain(sorted_files(&kernels_dir, "h").iter()) {
        println!("cargo:rerun-if-changed={}", header.display());
    }
    let mut table = String::from("/// Kernel modules compiled from kernels/*.cu: (file stem, fatbin).\npub const MODULES: &[(&str, &[u8])] = &[\n");
    for source in sorted_files(&kernels_dir, "cu") {
        println!("cargo:rerun-if-changed={}", source.display());
        let stem = source.file_stem().unwrap().to_string_lossy().into_owned();
        let fatbin = out.join(format!("{stem}.fatbin"));
        let mut cmd = Command::new(&nvcc);
        cmd.args(["-fatbin", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xptxas", "-warn-spills"])
            .arg("-I")
            .arg(&kernels_dir);
        for arch in &archs {
            cmd.arg(format!("-gencode=arch=compute_{arch},code=sm_{arch}"));
        }
        cmd.arg(format!("-gencode=arch=compute_{newest},code=compute_{newest}"));
        cmd.arg("-o").arg(&fatbin).arg(&source);
        let status = cmd.status().unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
        assert!(status.success(), "nvcc failed on {}", source.display());
        writeln!(table, "    ({stem:?}, include_bytes!({:?})),", fatbin.display().to_string()).unwrap();
    }
    table.push_str("];\n");
    fs::write(out.join("kernels.rs"), table).unwrap();
}

/// cbindgen → include/edgellm_allreduce.h, written only when its text changes (it is committed).
fn write_c_header(root: &Path) {
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    generate(config, &root.join("src/abi.rs"), &root.join("include/edgellm_allreduce.h"));
}

/// cbindgen → kernels/ear_contract.h from src/contract.rs (committed; the kernel simulations
/// compile the kernels without cargo).
fn write_kernel_contract(root: &Path) {
    println!("cargo:rerun-if-changed=src/contract.rs");
    let mut config = cbindgen::Config {
        language: cbindgen::Language::C,
        include_guard: Some("EAR_CONTRACT_H".to_owned()),
        sys_includes: vec!["stdint.h".to_owned()],
        no_includes: true,
        usize_is_size_t: true,
        documentation_style: cbindgen::DocumentationStyle::C99,
        header: Some(
            "/*\n * The constants and parameter blocks of the host <-> kernel contract. Generated by cbindgen\n * from src/contract.rs (build.rs): do not edit. allreduce_params.h builds the rules on it.\n */"
                .to_owned(),
        ),
        ..Default::default()
    };
    config.export.item_types = vec![cbindgen::ItemType::Constants, cbindgen::ItemType::Structs];
    // No function uses the parameter blocks on the C side: name them.
    config.export.include = vec!["EarAllReduceParams".to_owned(), "EarFusedParams".to_owned()];
    config.parse.parse_deps = false;
    generate(config, &root.join("src/contract.rs"), &root.join("kernels/ear_contract.h"));
}

/// cbindgen of `src` into `path`, written only when its text changes.
fn generate(config: cbindgen::Config, src: &Path, path: &Path) {
    let header = cbindgen::Builder::new()
        .with_config(config)
        .with_src(src)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen could not generate {}: {e}", path.display()));
    let mut text = Vec::new();
    header.write(&mut text);
    if fs::read(path).ok().as_deref() != Some(&text[..]) {
        fs::write(path, &text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}
