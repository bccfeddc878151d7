//! CUDA plumbing of the benchmark: device buffers, captures, timed batches, the watchdog.
//! Contexts are the devices' primary contexts (cudarc's `CudaContext::new`), the same ones the
//! library, NCCL and TensorRT use.

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaGraph, CudaStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub type Res<T> = Result<T, String>;

/// Adds what was being done to an error.
pub trait Context<T> {
    fn ctx(self, what: &str) -> Res<T>;
}
impl<T, E: std::fmt::Debug> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| format!("{what}: {e:?}"))
    }
}

pub fn check(call: &str, r: sys::CUresult) -> Res<()> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(format!("{call}: {e:?}")),
    }
}

/// Number of CUDA devices, 0 when there is no driver.
pub fn device_count() -> i32 {
    // SAFETY: only probes for libcuda.
    if !unsafe { sys::is_culib_present() } {
        return 0;
    }
    CudaContext::device_count().unwrap_or(0)
}

/// The primary context of `ordinal`, with cudarc's event tracking off (the benchmark orders its
/// streams itself, and tracking events would break graph capture).
pub fn context(ordinal: usize) -> Res<Arc<CudaContext>> {
    let ctx = CudaContext::new(ordinal).ctx(&format!("creating the context of device {ordinal}"))?;
    // SAFETY: every buffer is used on explicitly ordered streams (events, synchronize).
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

pub fn device_name(ctx: &CudaContext) -> String {
    ctx.name().unwrap_or_else(|_| format!("device {}", ctx.ordinal()))
}

/// A device allocation (`cuMemAlloc`: 256-byte aligned), freed on drop.
pub struct DevBuf {
    pub ptr: u64,
    pub bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Res<DevBuf> {
        ctx.bind_to_thread().ctx("binding the context")?;
        let mut ptr = 0;
        // SAFETY: valid out-pointer, context current.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) })
            .map_err(|e| format!("{e} ({} bytes on device {})", bytes, ctx.ordinal()))?;
        Ok(DevBuf { ptr, bytes, ctx: ctx.clone() })
    }

    /// Copies `data` to the start of the buffer (synchronous).
    pub fn upload(&self, data: &[u8]) -> Res<()> {
        assert!(data.len() <= self.bytes);
        self.ctx.bind_to_thread().ctx("binding the context")?;
        // SAFETY: the destination holds data.len() bytes.
        check("cuMemcpyHtoD", unsafe { sys::cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), data.len()) })?;
        // A copy from pageable memory may return before its DMA lands, ordered only with the
        // legacy stream: wait for it before non-blocking streams read the buffer.
        // SAFETY: no arguments.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    /// The first `len` bytes (synchronous; synchronize the writing stream first).
    pub fn download(&self, len: usize) -> Res<Vec<u8>> {
        assert!(len <= self.bytes);
        self.ctx.bind_to_thread().ctx("binding the context")?;
        let mut v = vec![0u8; len];
        // SAFETY: the source holds len bytes, the destination too.
        check("cuMemcpyDtoH", unsafe { sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), self.ptr, len) })?;
        Ok(v)
    }
}

/// Frees a device resource of `ctx` once the context's work is done: makes it current,
/// synchronizes, then runs `free` (nothing when the context cannot be made current).
fn release(ctx: &CudaContext, free: impl FnOnce()) {
    if ctx.bind_to_thread().is_ok() {
        // SAFETY: no arguments; the context is current.
        unsafe { sys::cuCtxSynchronize() };
        free();
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in this context, which release has synchronized.
        release(&self.ctx, || unsafe {
            sys::cuMemFree_v2(self.ptr);
        });
    }
}

/// Fills `bytes` bytes at `ptr` with `value`, in stream order.
pub fn memset_async(ptr: u64, value: u8, bytes: usize, stream: &CudaStream) -> Res<()> {
    // SAFETY: ptr holds `bytes` bytes of the stream's device.
    check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(ptr, value, bytes, stream.cu_stream()) })
}

/// An empty kernel (one warp that returns), JIT-compiled by the driver from PTX: the floor of
/// the simulation as the peer figures define it ("empty fork/join of N kernels").
pub struct EmptyKernel {
    module: sys::CUmodule,
    func: sys::CUfunction,
    ctx: Arc<CudaContext>,
}
// SAFETY: module and function handles are context-wide, usable from any thread with the
// context current; they are only unloaded on drop.
unsafe impl Send for EmptyKernel {}
unsafe impl Sync for EmptyKernel {}

const EMPTY_PTX: &str =
    ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry edgellm_bench_empty()\n{\n\tret;\n}\n\0";

impl EmptyKernel {
    pub fn new(ctx: &Arc<CudaContext>) -> Res<EmptyKernel> {
        ctx.bind_to_thread().ctx("binding the context")?;
        let mut module = std::ptr::null_mut();
        // SAFETY: NUL-terminated PTX text; valid out-pointer.
        check("cuModuleLoadData (empty kernel)", unsafe {
            sys::cuModuleLoadData(&mut module, EMPTY_PTX.as_ptr().cast())
        })?;
        let mut func = std::ptr::null_mut();
        // SAFETY: the module was just loaded; the name is NUL-terminated.
        let got = check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut func, module, c"edgellm_bench_empty".as_ptr())
        });
        let kernel = EmptyKernel { module, func, ctx: ctx.clone() };
        got.map(|_| kernel)
    }

    pub fn launch(&self, stream: &CudaStream) -> Res<()> {
        // SAFETY: a kernel without parameters, one block of 32 threads, no shared memory.
        check("cuLaunchKernel (empty kernel)", unsafe {
            sys::cuLaunchKernel(
                self.func,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream.cu_stream(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        })
    }
}

impl Drop for EmptyKernel {
    fn drop(&mut self) {
        // SAFETY: loaded by cuModuleLoadData in this context, which release has synchronized.
        release(&self.ctx, || unsafe {
            sys::cuModuleUnload(self.module);
        });
    }
}

/// Captures what `enqueue` puts on `stream` into an instantiated, uploaded graph.
pub fn capture(stream: &Arc<CudaStream>, enqueue: impl FnOnce() -> Res<()>) -> Res<CudaGraph> {
    // Relaxed: the capture must not fail because another thread (another rank, NCCL's proxy)
    // makes a call that is unsafe during a global capture.
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).ctx("cuStreamBeginCapture")?;
    let enqueued = enqueue();
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    enqueued?;
    let graph = ended.ctx("cuStreamEndCapture / cuGraphInstantiate")?.ok_or("the capture recorded nothing")?;
    graph.upload().ctx("cuGraphUpload")?;
    Ok(graph)
}

/// The start gate of a timed batch: a host-mapped word that the streams wait on
/// (`cuStreamWaitValue32`) before their start event. A batch is enqueued behind the closed gate,
/// then one store opens it for every stream (every device) at once: the replays run back to back
/// from a full queue, so the time is the GPU's, not the host's launch rate, and devices start
/// within the gate's wake-up latency of each other.
pub struct Gate {
    word: *mut u32,
}
// SAFETY: the word is pinned host memory that lives as long as the gate; it is only accessed
// atomically.
unsafe impl Send for Gate {}
unsafe impl Sync for Gate {}

/// More calls than this behind a closed gate could fill a stream's queue and block the host
/// before it opens the gate: such batches run ungated.
pub const GATE_MAX_CALLS: u32 = 100;

impl Gate {
    /// Allocates the word (portable, mapped pinned memory); needs a current context.
    pub fn new() -> Res<Gate> {
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; 4 bytes.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, 64, sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP)
        })?;
        let word = p.cast::<u32>();
        // SAFETY: freshly allocated, aligned, exclusively ours.
        unsafe { word.write_volatile(0) };
        Ok(Gate { word })
    }

    fn atomic(&self) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: an aligned u32 that lives as long as self, only accessed atomically.
        unsafe { &*(self.word as *const std::sync::atomic::AtomicU32) }
    }

    /// The word's device address in the current context.
    pub fn device_ptr(&self) -> Res<u64> {
        let mut d = 0;
        // SAFETY: valid out-pointer; the word is mapped (DEVICEMAP).
        check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.word.cast(), 0) })?;
        Ok(d)
    }

    /// The value that opens the next batch (read between batches, when nobody writes).
    pub fn next(&self) -> u32 {
        self.atomic().load(std::sync::atomic::Ordering::SeqCst).wrapping_add(1)
    }

    /// Makes `stream` wait until the word reaches `value`.
    pub fn wait(device_ptr: u64, value: u32, stream: &CudaStream) -> Res<()> {
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: device_ptr is the mapped word in this stream's context.
        check("cuStreamWaitValue32", unsafe { sys::cuStreamWaitValue32_v2(stream.cu_stream(), device_ptr, value, geq) })
    }

    pub fn open(&self, value: u32) {
        self.atomic().store(value, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether `stream` can wait on the gate (a wait that is already satisfied, then a sync).
    pub fn probe(&self, stream: &CudaStream) -> Res<u64> {
        let d = self.device_ptr()?;
        Gate::wait(d, 0, stream)?;
        stream.synchronize().ctx("synchronize")?;
        Ok(d)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc; every stream waiting on it has finished.
        unsafe { sys::cuMemFreeHost(self.word.cast()) };
    }
}

/// Two timing events on one stream.
pub struct Timer {
    start: CudaEvent,
    stop: CudaEvent,
}

impl Timer {
    pub fn new(ctx: &Arc<CudaContext>) -> Res<Timer> {
        let ev = || ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).ctx("cuEventCreate");
        Ok(Timer { start: ev()?, stop: ev()? })
    }

    pub fn events(&self) -> (&CudaEvent, &CudaEvent) {
        (&self.start, &self.stop)
    }

    /// Waits for the stop event; the time per call (µs) of `calls` calls between the events.
    pub fn wait_per_call_us(&self, calls: u32) -> Res<f64> {
        self.stop.synchronize().ctx("cuEventSynchronize")?;
        let ms = self.start.elapsed_ms(&self.stop).ctx("cuEventElapsedTime")?;
        Ok(ms as f64 * 1000.0 / calls.max(1) as f64)
    }
}

/// Aborts the process (exit 3) when no progress is reported for `limit`: the custom kernels
/// spin on their peers, so a broken case hangs instead of failing.
pub mod watchdog {
    use super::*;

    struct State {
        last: Instant,
        case: String,
        limit: Duration,
        note: String,
    }
    static STATE: Mutex<Option<State>> = Mutex::new(None);

    pub fn start(limit: Duration, note: String) {
        *STATE.lock().unwrap() = Some(State { last: Instant::now(), case: "setup".into(), limit, note });
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_millis(250));
            let guard = STATE.lock().unwrap();
            let Some(s) = guard.as_ref() else { continue };
            if s.last.elapsed() > s.limit {
                eprintln!("\nHANG: no progress for {:.0} s in {}; {}", s.limit.as_secs_f64(), s.case, s.note);
                std::process::exit(3);
            }
        });
    }

    /// A new case begins.
    pub fn at(case: String) {
        if let Some(s) = STATE.lock().unwrap().as_mut() {
            s.case = case;
            s.last = Instant::now();
        }
    }

    /// The current case made progress.
    pub fn tick() {
        if let Some(s) = STATE.lock().unwrap().as_mut() {
            s.last = Instant::now();
        }
    }
}
