//! The embedded kernels as they load on this machine's GPU 0, checked against what
//! tools/gpu/no_image_check.sh built the test for (`EDGELLM_TEST_EXPECT_KERNELS`):
//!   `none`: no image for this GPU (sm_100 only on an sm_90): no group forms, the fused op's
//!           norm kernel is refused, with the reason;
//!   `jit`:  PTX of compute_80 only, JIT-compiled: every kernel loads, and PDL is off (that code
//!           has no griddepcontrol.wait).
//! Needs a GPU and that variable, so it is `#[ignore]`d: no_image_check.sh runs it with `--ignored`.

use edgellm_allreduce::{device_kernels, Group, KERNEL_IMAGES};

#[test]
#[ignore = "needs a GPU and EDGELLM_TEST_EXPECT_KERNELS (tools/gpu/no_image_check.sh)"]
fn kernels_load_as_the_build_expects() {
    let expect = std::env::var("EDGELLM_TEST_EXPECT_KERNELS").expect("EDGELLM_TEST_EXPECT_KERNELS: none or jit");
    // SAFETY: only probes for libcuda.
    assert!(unsafe { cudarc::driver::sys::is_culib_present() }, "no CUDA driver: this test needs a GPU");
    let k = device_kernels(0).expect("loading the kernels is not an error, whatever loads");
    eprintln!("images {KERNEL_IMAGES}: unavailable {:?}, pdl {}", k.unavailable, k.pdl);
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
