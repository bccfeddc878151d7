//! Builds what the Rust core links or embeds:
//!   1. every `kernels/*.cu` with nvcc into a fatbin embedded in the library (`$OUT_DIR/kernels.rs`);
//!   2. the C ABI header `include/edgellm_allreduce.h` with cbindgen;
//!   3. the C++ TensorRT adapter (`cpp/*.cpp`) and the cxx bridge, as a whole archive.
//!
//! Before them, `kernels/ear_contract.h` (the kernels' constants and parameter blocks) is generated
//! by cbindgen from `src/contract.rs`, so Rust and CUDA read one definition.
//!
//! Generated headers go to `$OUT_DIR`; the committed copies in the tree (the kernel simulations
//! and users read them without cargo) are checked against them by unit tests, and rewritten only
//! when `EDGELLM_WRITE_GENERATED=1` asks for it: a build never edits the source tree.
//!
//! Toolchain: `CUDA_HOME` (nvcc and CUDA headers) and `EDGELLM_TRT_INCLUDE` (TensorRT headers) or
//! `TRT_ROOT`; when they are unset, what `eval "$(tools/setup.sh)"` installed (CUDA 13.0 from
//! PyPI, TensorRT headers from the trtx-sys crate's sources). The build only looks for them: it
//! never installs anything. `EDGELLM_CUDA_ARCHS` chooses the SASS targets (default below), plus
//! PTX of the lowest and of the newest (docs/PLATFORMS.md). The fatbins do not depend on the Rust
//! target, so they are cached by content (`$EDGELLM_TOOLCHAIN_DIR/fatbin`): a cross build or
//! another clone reuses them.

use std::collections::hash_map::DefaultHasher;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Keep in step with CMakeLists.txt's EDGELLM_CUDA_ARCHS and docs/PLATFORMS.md.
const DEFAULT_ARCHS: &str = "80;86;89;90;100;110;120;121";

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    for var in [
        "EDGELLM_WRITE_GENERATED",
        "CUDA_HOME",
        "EDGELLM_TRT_INCLUDE",
        "TRT_ROOT",
        "EDGELLM_CUDA_ARCHS",
        "EDGELLM_TOOLCHAIN_DIR",
        "XDG_CACHE_HOME",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let toolchain = Toolchain::find();

    write_kernel_contract(&root, &out);
    compile_kernels(&root, &out, &toolchain);
    write_c_header(&root, &out);
    // The host half of the kernel contract (workspace layout, launch rule) from its own header.
    // -Werror=switch: the rules switch over every kind of a family's rule, with no default.
    cc::Build::new()
        .file(root.join("kernels/layout.c"))
        .include(root.join("kernels"))
        .flag("-Werror=switch")
        .compile("edgellm_kernel_layout");
    println!("cargo:rerun-if-changed=kernels/layout.c");

    let cpp: Vec<PathBuf> = sorted_files(&root.join("cpp"), "cpp");
    cxx_build::bridge("src/api/bridge.rs")
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
    println!("cargo:rerun-if-changed=src/api/abi.rs");
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
    env::split_paths(&env::var_os("PATH")?)
        .find(|d| d.join("nvcc").is_file())
        .and_then(|bin| bin.parent().map(Path::to_path_buf))
}

fn missing(what: &str, variable: &str) -> ! {
    panic!(
        "{what} not found. Set {variable}, or install the toolchain into {} with\n    eval \"$(tools/setup.sh)\"\n(the CUDA 13.0 compiler from PyPI, TensorRT headers from the trtx-sys crate; cmake and GoogleTest from apt)",
        toolchain_cache().display()
    )
}

fn sorted_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == ext)).collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// The nvcc targets: SASS of each arch; PTX of the lowest, so that every GPU at least as new
/// JIT-compiles every kernel (also the residual + RMSNorm kernel the fused op needs after NCCL),
/// and PTX of the newest, so that a GPU newer than the list JITs code with the newest features.
fn gencodes(archs: &str) -> (Vec<String>, Vec<String>) {
    let mut archs: Vec<u32> = archs
        .split([';', ',', ' '])
        .filter(|a| !a.is_empty())
        .map(|a| a.parse().unwrap_or_else(|_| panic!("EDGELLM_CUDA_ARCHS: {a:?} is not a number like 90")))
        .collect();
    archs.sort_unstable();
    archs.dedup();
    let (Some(&lowest), Some(&newest)) = (archs.first(), archs.last()) else { panic!("EDGELLM_CUDA_ARCHS is empty") };
    let mut ptx = vec![lowest];
    if newest != lowest {
        ptx.push(newest);
    }
    let mut flags: Vec<String> = archs.iter().map(|a| format!("-gencode=arch=compute_{a},code=sm_{a}")).collect();
    flags.extend(ptx.iter().map(|a| format!("-gencode=arch=compute_{a},code=compute_{a}")));
    let images = archs.iter().map(|a| format!("sm_{a}")).chain(ptx.iter().map(|a| format!("compute_{a}"))).collect();
    (flags, images)
}

/// nvcc each kernel file into a fatbin and write `kernels.rs`: `MODULES: &[(name, fatbin)]` and
/// `IMAGES` (what the fatbins hold, for messages).
fn compile_kernels(root: &Path, out: &Path, toolchain: &Toolchain) {
    let (flags, images) = gencodes(&env::var("EDGELLM_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.to_owned()));
    let nvcc = toolchain.cuda_home.join("bin/nvcc");
    let kernels_dir = root.join("kernels");
    println!("cargo:rerun-if-changed={}", kernels_dir.display());
    let headers: Vec<PathBuf> =
        sorted_files(&kernels_dir, "cuh").into_iter().chain(sorted_files(&kernels_dir, "h")).collect();
    for header in &headers {
        println!("cargo:rerun-if-changed={}", header.display());
    }
    let mut args: Vec<String> = ["-fatbin", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xptxas", "-warn-spills"]
        .map(String::from)
        .to_vec();
    args.extend(flags);
    // What the output depends on besides the .cu file itself: the compiler, its flags, the headers.
    let version = Command::new(&nvcc).arg("--version").output().map(|o| o.stdout).unwrap_or_default();
    let mut common = DefaultHasher::new();
    (nvcc.to_string_lossy(), &version, &args).hash(&mut common);
    for header in &headers {
        (header.file_name(), fs::read(header).expect("reading a kernel header")).hash(&mut common);
    }
    let cache = fatbin_cache();
    let sources = sorted_files(&kernels_dir, "cu");
    // One nvcc per file, as many at once as cargo gives jobs (the compile dominates a CI build).
    let jobs = env::var("NUM_JOBS").ok().and_then(|j| j.parse().ok()).unwrap_or(1usize).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(sources.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(source) = sources.get(i) else { break };
                let stem = source.file_stem().unwrap().to_string_lossy();
                let mut key = common.clone();
                fs::read(source).expect("reading a kernel source").hash(&mut key);
                let fatbin = out.join(format!("{stem}.fatbin"));
                let cached = cache.as_ref().map(|dir| dir.join(format!("{stem}-{:016x}.fatbin", key.finish())));
                if let Some(hit) = cached.as_ref().filter(|c| fs::copy(c, &fatbin).is_ok()) {
                    // Marks the entry as recently used for pruning.
                    fs::File::options()
                        .append(true)
                        .open(hit)
                        .and_then(|f| f.set_modified(std::time::SystemTime::now()))
                        .ok();
                    continue;
                }
                let status = Command::new(&nvcc)
                    .args(&args)
                    .arg("-I")
                    .arg(&kernels_dir)
                    .arg("-o")
                    .arg(&fatbin)
                    .arg(source)
                    .status()
                    .unwrap_or_else(|e| panic!("running {}: {e}", nvcc.display()));
                assert!(status.success(), "nvcc failed on {}", source.display());
                if let Some(cached) = cached {
                    // Through a temporary name: a concurrent build never reads a partial file.
                    let tmp = cached.with_extension(format!("tmp{}", std::process::id()));
                    if fs::copy(&fatbin, &tmp).is_ok() && fs::rename(&tmp, &cached).is_err() {
                        fs::remove_file(&tmp).ok();
                    }
                }
            });
        }
    });
    if let Some(dir) = &cache {
        prune(dir, 64);
    }
    let mut table = String::from(
        "/// Kernel modules compiled from kernels/*.cu: (file stem, fatbin, the kernels it defines: empty\n/// when its symbol names could not be read).\npub(crate) const MODULES: &[(&str, &[u8], &[&str])] = &[\n",
    );
    for source in &sources {
        println!("cargo:rerun-if-changed={}", source.display());
        let stem = source.file_stem().unwrap().to_string_lossy();
        let fatbin = out.join(format!("{stem}.fatbin"));
        let kernels = kernel_names(&fs::read(&fatbin).expect("reading a fatbin"));
        writeln!(table, "    ({stem:?}, include_bytes!({:?}), &{kernels:?}),", fatbin.display().to_string()).unwrap();
    }
    table.push_str("];\n");
    writeln!(
        table,
        "/// The images in every fatbin (SASS sm_XY, PTX compute_XY).\npub const IMAGES: &str = {:?};",
        images.join(" ")
    )
    .unwrap();
    let default_images = gencodes(DEFAULT_ARCHS).1.join(" ");
    writeln!(table, "/// The images of a build with the default EDGELLM_CUDA_ARCHS (for the tests).\n#[cfg(test)]\npub(crate) const DEFAULT_IMAGES: &str = {default_images:?};").unwrap();
    fs::write(out.join("kernels.rs"), table).unwrap();
}

/// The kernels a fatbin defines: the `ear_*` names of its ELF string tables (NUL-separated
/// strings; section names such as `.text.ear_...` do not start after a NUL), so that the loader
/// asks each module only for the functions it holds. Empty when the images are compressed.
fn kernel_names(fatbin: &[u8]) -> Vec<String> {
    let mut names: Vec<String> = fatbin
        .windows(5)
        .enumerate()
        .filter(|(_, w)| w == b"\0ear_")
        .filter_map(|(i, _)| {
            let rest = &fatbin[i + 1..];
            let name = &rest[..rest.iter().position(|&c| c == 0)?];
            name.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
                .then(|| String::from_utf8_lossy(name).into_owned())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `$EDGELLM_TOOLCHAIN_DIR/fatbin` (the toolchain's cache folder), if it can be created.
fn fatbin_cache() -> Option<PathBuf> {
    let base = env::var_os("EDGELLM_TOOLCHAIN_DIR").map(PathBuf::from).or_else(|| {
        env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("edgellm-allreduce"))
    })?;
    let dir = base.join("fatbin");
    fs::create_dir_all(&dir).ok().map(|_| dir)
}

/// Keeps the `keep` most recently used fatbins of the cache.
fn prune(dir: &Path, keep: usize) {
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()).filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path()))).collect()
        })
        .unwrap_or_default();
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, path) in entries.into_iter().skip(keep) {
        fs::remove_file(path).ok();
    }
}

/// cbindgen → `$OUT_DIR/edgellm_allreduce.h` (committed as include/edgellm_allreduce.h).
fn write_c_header(root: &Path, out: &Path) {
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    generate(config, &root.join("src/api/abi.rs"), out, &root.join("include/edgellm_allreduce.h"));
}

/// cbindgen → `$OUT_DIR/ear_contract.h` from src/contract.rs (committed as kernels/ear_contract.h:
/// the kernel simulations compile the kernels without cargo).
fn write_kernel_contract(root: &Path, out: &Path) {
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
    config.export.item_types =
        vec![cbindgen::ItemType::Constants, cbindgen::ItemType::Structs, cbindgen::ItemType::Enums];
    // No function uses the parameter blocks on the C side: name them.
    config.export.include = [
        "EarAllReduceParams",
        "EarFusedParams",
        "EarPlan",
        "EarRule",
        "EarCallFacts",
        "EarSelfTestParams",
        "EarSelfTestResult",
        "EarSelfTestPushParams",
    ]
    .map(String::from)
    .to_vec();
    // EAR_GRID_RULE_VECS, ...: C enums, so a switch that misses one fails the build (-Werror=switch).
    config.enumeration.rename_variants = cbindgen::RenameRule::QualifiedScreamingSnakeCase;
    config.parse.parse_deps = false;
    generate(config, &root.join("src/contract.rs"), out, &root.join("kernels/ear_contract.h"));
}

/// cbindgen of `src` into `$OUT_DIR/<committed's file name>`, and into `committed` too when
/// `EDGELLM_WRITE_GENERATED=1` (and its text changed).
fn generate(config: cbindgen::Config, src: &Path, out: &Path, committed: &Path) {
    let header = cbindgen::Builder::new()
        .with_config(config)
        .with_src(src)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen could not generate {}: {e}", committed.display()));
    let mut text = Vec::new();
    header.write(&mut text);
    let mut targets = vec![out.join(committed.file_name().expect("a file name"))];
    if env::var("EDGELLM_WRITE_GENERATED").is_ok_and(|v| v == "1") {
        targets.push(committed.to_path_buf());
    }
    for path in targets {
        if fs::read(&path).ok().as_deref() != Some(&text[..]) {
            fs::write(&path, &text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
    }
}
