//! The embedded kernels as they load on this machine's GPU 0, checked against what
//! tools/gpu/no_image_check.sh built the test for (`EDGELLM_TEST_EXPECT_KERNELS`):
//!   `none`: no image for this GPU (sm_100 only on an sm_90): no group forms, the fused op's
//!           norm kernel is refused, with the reason;
//!   `jit`:  PTX of compute_80 only, JIT-compiled: every kernel loads, and PDL is off (that code
//!           has no griddepcontrol.wait).
//! Skips without that variable or without a GPU.

use edgellm_allreduce::kernels;
use edgellm_allreduce::workspace::Group;

#[test]
fn kernels_load_as_the_build_expects() {
    let Ok(expect) = std::env::var("EDGELLM_TEST_EXPECT_KERNELS") else {
        eprintln!("EDGELLM_TEST_EXPECT_KERNELS is unset (tools/gpu/no_image_check.sh sets it): skipped");
        return;
    };
    // SAFETY: only probes for libcuda.
    if !unsafe { cudarc::driver::sys::is_culib_present() } || edgellm_allreduce::cuda::device_count().unwrap_or(0) == 0 {
        eprintln!("no CUDA device: skipped");
        return;
    }
    let k = kernels::for_device(0).expect("loading the kernels is not an error, whatever loads");
    eprintln!("images {}: unavailable {:?}, pdl {}", kernels::IMAGES, k.unavailable, k.pdl);
    match expect.as_str() {
        "none" => {
            let why = k.unavailable.as_deref().expect("no kernel loads on this GPU");
            assert!(why.contains("no kernel image of this library runs on this GPU"), "{why}");
            let norm = k.require_norm().expect_err("the norm kernel cannot run either");
            assert!(norm.to_string().contains("fused residual + RMSNorm all-reduce cannot run"), "{norm}");
            match Group::simulated(0, 2, 1 << 20) {
                Ok(_) => panic!("a group formed without kernels"),
                Err(e) => assert!(e.to_string().contains("no kernel image"), "{e}"),
            }
        }
        "jit" => {
            assert_eq!(k.unavailable, None, "every module loads from PTX");
            assert!(!k.pdl, "compute_80 code has no griddepcontrol.wait: launching it early would race");
            assert!(Group::simulated(0, 2, 1 << 20).is_ok());
        }
        other => panic!("EDGELLM_TEST_EXPECT_KERNELS={other}: expected none or jit"),
    }
}
