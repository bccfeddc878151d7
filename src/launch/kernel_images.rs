//! Which of the embedded kernel images a GPU can run, and what is said when its kernels cannot
//! load (docs/PLATFORMS.md). The fatbins hold SASS for each architecture of `EDGELLM_CUDA_ARCHS`
//! and PTX of the lowest and the newest; the driver picks, per the CUDA compatibility rules,
//! SASS of the same major version and a minor version no higher than the GPU's, else PTX of a
//! virtual architecture no newer than the GPU, compiled at load (JIT).

/// One image of the embedded fatbins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Image {
    /// `sm_XY`: machine code, compute capability X.Y as `XY`.
    Sass(u32),
    /// `compute_XY`: PTX, compiled by the driver for the GPU at load.
    Ptx(u32),
}

/// Parses an image list such as `"sm_80 sm_90 compute_80 compute_90"` (build.rs's `IMAGES`).
pub(crate) fn parse(images: &str) -> Vec<Image> {
    images
        .split_whitespace()
        .filter_map(|w| {
            let number = |s: &str| s.parse::<u32>().ok();
            w.strip_prefix("sm_")
                .and_then(number)
                .map(Image::Sass)
                .or_else(|| w.strip_prefix("compute_").and_then(number).map(Image::Ptx))
        })
        .collect()
}

/// The image the driver loads on a GPU of compute capability `cc` (major * 10 + minor), if any:
/// the newest compatible SASS, else the newest PTX not newer than the GPU.
pub(crate) fn runnable(images: &[Image], cc: u32) -> Option<Image> {
    let sass = images.iter().filter_map(|i| match *i {
        Image::Sass(a) if a / 10 == cc / 10 && a <= cc => Some(a),
        _ => None,
    });
    let ptx = images.iter().filter_map(|i| match *i {
        Image::Ptx(a) if a <= cc => Some(a),
        _ => None,
    });
    sass.max().map(Image::Sass).or_else(|| ptx.max().map(Image::Ptx))
}

/// The driver's name for the errors loading a module can give.
pub(crate) fn load_error_name(code: i32) -> &'static str {
    match code {
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        200 => "CUDA_ERROR_INVALID_IMAGE",
        209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
        218 => "CUDA_ERROR_INVALID_PTX",
        221 => "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        223 => "CUDA_ERROR_JIT_COMPILATION_DISABLED",
        _ => "a CUDA error",
    }
}

/// The one warning of a device whose kernel modules did not all load: why, and what runs
/// instead. `failed`: (module, CUDA error code) of each module that failed.
pub(crate) fn unavailable_message(
    device: i32,
    cc: u32,
    images: &str,
    failed: &[(&str, i32)],
    norm_loaded: bool,
) -> String {
    let why = if runnable(&parse(images), cc).is_none() {
        format!("no kernel image of this library runs on this GPU (it holds {images})")
    } else {
        let modules: Vec<String> =
            failed.iter().map(|(m, code)| format!("{m} ({}, {code})", load_error_name(*code))).collect();
        format!("kernel modules failed to load: {}", modules.join(", "))
    };
    let fused = if norm_loaded {
        ""
    } else {
        "; the fused residual + RMSNorm op cannot run on it (such plugins fail at configure time)"
    };
    format!(
        "device {device} (sm_{cc}): {why}. The custom all-reduce kernels are off on this device: all-reduce uses NCCL (tp_size 1: a copy){fused}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_lists_parse() {
        assert_eq!(
            parse("sm_80 sm_121 compute_80 compute_121"),
            [Image::Sass(80), Image::Sass(121), Image::Ptx(80), Image::Ptx(121)]
        );
        assert_eq!(parse("sm_x compute_ bogus"), [], "malformed words are skipped");
    }

    #[test]
    fn the_driver_rules_pick_sass_of_the_same_major_else_older_ptx() {
        let default = parse("sm_80 sm_86 sm_89 sm_90 sm_100 sm_110 sm_120 sm_121 compute_80 compute_121");
        let table = [
            (80, Image::Sass(80)),
            (86, Image::Sass(86)),
            (87, Image::Sass(86)), // Jetson Orin
            (89, Image::Sass(89)),
            (90, Image::Sass(90)),
            (100, Image::Sass(100)),
            (103, Image::Sass(100)), // B300
            (110, Image::Sass(110)), // Thor
            (120, Image::Sass(120)),
            (121, Image::Sass(121)), // DGX Spark
            (130, Image::Ptx(121)),  // newer than the list: the newest PTX
        ];
        for (cc, image) in table {
            assert_eq!(runnable(&default, cc), Some(image), "sm_{cc}");
        }
        assert_eq!(runnable(&default, 75), None, "older than the lowest PTX");
        // The H200 check's library: SASS and PTX of sm_100 only, nothing an sm_90 runs.
        let no_hopper = parse("sm_100 compute_100");
        assert_eq!(runnable(&no_hopper, 90), None);
        assert_eq!(runnable(&no_hopper, 120), Some(Image::Ptx(100)), "SASS never crosses a major version");
        assert_eq!(runnable(&parse("sm_90 compute_80"), 110), Some(Image::Ptx(80)));
    }

    /// The GPUs of the platform table (docs/PLATFORMS.md, "The platform table") by compute capability.
    const PLATFORM_TABLE: [u32; 10] = [80, 86, 87, 89, 90, 100, 103, 110, 120, 121];

    #[test]
    fn a_default_build_has_sass_for_every_gpu_of_the_platform_table_and_ptx_for_the_rest() {
        let images = parse(crate::launch::kernels::DEFAULT_IMAGES);
        for cc in PLATFORM_TABLE {
            assert!(matches!(runnable(&images, cc), Some(Image::Sass(_))), "sm_{cc}: {:?}", runnable(&images, cc));
        }
        assert!(images.contains(&Image::Ptx(80)), "PTX of the lowest: the norm kernel exists on every GPU from sm_80");
        assert_eq!(runnable(&images, 130), Some(Image::Ptx(121)), "a GPU newer than the list JITs the newest PTX");
    }

    #[test]
    fn the_warning_says_why_and_what_runs_instead() {
        let m = unavailable_message(0, 90, "sm_100 compute_100", &[("oneshot", 209), ("fused_norm", 209)], false);
        assert!(
            m.starts_with(
                "device 0 (sm_90): no kernel image of this library runs on this GPU (it holds sm_100 compute_100)"
            ),
            "{m}"
        );
        assert!(m.contains("all-reduce uses NCCL (tp_size 1: a copy)"), "{m}");
        assert!(m.contains("fused residual + RMSNorm op cannot run"), "{m}");
        let m = unavailable_message(1, 90, "sm_90 compute_90", &[("twoshot", 2)], true);
        assert!(m.contains("kernel modules failed to load: twoshot (CUDA_ERROR_OUT_OF_MEMORY, 2)"), "{m}");
        assert!(!m.contains("RMSNorm"), "the norm kernel loaded: the fused op still runs after NCCL: {m}");
    }
}
