//! What the GPU test binaries share: the device, and a watchdog that turns a hang into a failure
//! that names the case.

use cudarc::driver::{sys, CudaContext};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// GPU 0's context, or a failure saying that the test needs a GPU.
pub fn gpu() -> Arc<CudaContext> {
    // SAFETY: only probes for libcuda.
    assert!(unsafe { sys::is_culib_present() }, "no CUDA driver: this test needs a GPU");
    assert!(CudaContext::device_count().unwrap_or(0) > 0, "no CUDA device: this test needs a GPU");
    let ctx = CudaContext::new(0).expect("a context on GPU 0");
    // SAFETY: the tests order their streams themselves (explicit synchronization before every read).
    unsafe { ctx.disable_event_tracking() };
    ctx
}

/// Aborts the process with the case name if a case hangs (spinning kernels that never meet).
pub struct Watchdog {
    case: Arc<Mutex<String>>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    pub fn start(limit: Duration) -> Self {
        let case = Arc::new(Mutex::new(String::new()));
        let done = Arc::new(AtomicBool::new(false));
        let (c, d) = (case.clone(), done.clone());
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !d.load(Ordering::Relaxed) {
                if start.elapsed() > limit {
                    eprintln!("HANG: {}", c.lock().unwrap());
                    std::process::exit(3);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Watchdog { case, done }
    }

    pub fn at(&self, case: String) {
        *self.case.lock().unwrap() = case;
    }

    /// A watchdog of one case.
    #[allow(dead_code)] // not every test binary has single-case tests
    pub fn of(case: &str, limit: Duration) -> Self {
        let watchdog = Watchdog::start(limit);
        watchdog.at(case.to_owned());
        watchdog
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}
