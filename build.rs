//! Builds what the Rust core links or embeds:
//!   1. every `kernels/*.cu` with nvcc into a fatbin embedded in the library (`$OUT_DIR/kernels.rs`);
//!   2. the C ABI header `include/edgellm_allreduce.h` with cbindgen (rewritten only when it changes);
//!   3. the C++ TensorRT adapter (`cpp/*.cpp`) and the cxx bridge, as a whole archive.
//!
//! Toolchain: `CUDA_HOME` (nvcc and CUDA headers) and `EDGELLM_TRT_INCLUDE` (TensorRT headers) or
//! `TRT_ROOT`; when they are unset, `tools/setup.sh` installs or finds them (CUDA 13.0 from PyPI,
//! TensorRT headers from the trtx-sys crate's sources). `EDGELLM_CUDA_ARCHS` chooses the SASS
//! targets (default "80;86;89;90;100;120", plus PTX of the newest).

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCHS: &str = "80;86;89;90;100;120";

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in ["CUDA_HOME", "EDGELLM_TRT_INCLUDE", "TRT_ROOT", "EDGELLM_CUDA_ARCHS", "EDGELLM_TOOLCHAIN_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let toolchain = Toolchain::find(&root);

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
    fn find(root: &Path) -> Self {
        let mut cuda = env::var_os("CUDA_HOME").map(PathBuf::from);
        let mut trt = env::var_os("EDGELLM_TRT_INCLUDE")
            .map(PathBuf::from)
            .or_else(|| env::var_os("TRT_ROOT").map(|r| PathBuf::from(r).join("include")));
        if cuda.is_none() || trt.is_none() {
            let output = Command::new("bash")
                .arg(root.join("tools/setup.sh"))
                .output()
                .expect("running tools/setup.sh");
            assert!(
                output.status.success(),
                "tools/setup.sh failed (set CUDA_HOME and EDGELLM_TRT_INCLUDE or TRT_ROOT to skip it):\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            for line in String::from_utf8_lossy(&output.stdout).lines() {
                let Some((key, value)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) else { continue };
                let value = PathBuf::from(value.trim_matches('\''));
                match key {
                    "CUDA_HOME" if cuda.is_none() => cuda = Some(value),
                    "EDGELLM_TRT_INCLUDE" if trt.is_none() => trt = Some(value),
                    _ => {}
                }
            }
        }
        let toolchain = Toolchain { cuda_home: cuda.expect("CUDA_HOME"), trt_include: trt.expect("TensorRT headers") };
        assert!(
            toolchain.trt_include.join("NvInferRuntime.h").exists(),
            "no NvInferRuntime.h in {}",
            toolchain.trt_include.display()
        );
        toolchain
    }
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
    let header = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/abi.rs"))
        .generate()
        .expect("cbindgen could not generate the C header");
    let mut text = Vec::new();
    header.write(&mut text);
    let path = root.join("include/edgellm_allreduce.h");
    if fs::read(&path).ok().as_deref() != Some(&text[..]) {
        fs::write(&path, &text).expect("writing include/edgellm_allreduce.h");
    }
}
