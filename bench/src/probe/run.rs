//! The probe on the GPUs. Each line is timed `repeats` times after one untimed repeat; a repeat
//! is one or two lanes (a stream each, with its start and stop events) queued behind one start
//! gate (`gpu::Gate`) that then opens for all of them at once, so that a line's time is the
//! GPU's, not the host's launch rate, and the two lanes of a `both` line start together. A
//! repeat's figure is the bytes of all its lanes over its slowest lane's time.
//!
//! Before a link's first line that writes across it, the probe checks that the bytes arrive
//! (1 MiB copied, then compared); before its first line that reads across it, it checks with 16
//! dependent loads (bounded: [`READ_CHECK`]) that loads come back, then that the bytes do. Every
//! wait for the GPU polls with a deadline (`--timeout`, or the read check's); a wait that runs
//! out ends the process at once ([`give_up`]): a kernel whose load never returns cannot be
//! stopped, and the memory it may touch must not be freed (a free would synchronize, for ever).

use super::*;
use crate::gpu::{self, check, Context as _, DevBuf, Gate, Res, Timer};
use crate::stats::summarize;
use cudarc::driver::{sys, CudaContext, CudaStream};
use edgellm_allreduce::{probe, DeviceKernels, DevicePtr, Stream};
use std::sync::Arc;
use std::time::Instant;

/// The bound of the check before a link's first read: 16 round trips take microseconds.
const READ_CHECK: Duration = Duration::from_secs(2);
const READ_CHECK_ITERS: u32 = 16;
/// Bytes the arrival checks copy (at most the largest transfer).
const CHECK_BYTES: u64 = 1 << 20;
const WRITE_PATTERN: u8 = 0x5A;
const READ_PATTERN: u8 = 0xC3;

/// Pinned host memory, mapped into every context (portable), freed once its context's work is done.
struct HostBuf {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl HostBuf {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Res<HostBuf> {
        ctx.bind_to_thread().ctx("binding the context")?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a valid out-pointer.
        check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) })
            .map_err(|e| format!("{e} ({bytes} bytes of pinned host memory)"))?;
        // SAFETY: freshly allocated, `bytes` long, ours alone.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        Ok(HostBuf { ptr: p.cast(), bytes, ctx: ctx.clone() })
    }

    /// The device address of byte `offset` (unified addressing: the same in every context).
    fn dev(&self, offset: usize) -> Res<u64> {
        assert!(offset < self.bytes);
        self.ctx.bind_to_thread().ctx("binding the context")?;
        let mut d = 0;
        // SAFETY: a valid out-pointer; the address lies in the mapped allocation.
        check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr.add(offset).cast(), 0)
        })?;
        Ok(d)
    }

    /// Fills `len` bytes at `offset` (no GPU work may touch them meanwhile).
    fn fill(&self, offset: usize, len: usize, value: u8) {
        assert!(offset + len <= self.bytes);
        // SAFETY: within the allocation; the GPU is not using these bytes.
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), value, len) };
    }

    /// A copy of `len` bytes at `offset`, after the GPU work that wrote them completed.
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= self.bytes);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: within the allocation; the GPU's writes completed (a waited-for event).
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }.to_vec()
    }

    /// The `u64` at `offset`, written by a kernel that completed.
    fn word(&self, offset: usize) -> u64 {
        assert!(offset + 8 <= self.bytes && offset.is_multiple_of(8));
        // SAFETY: an aligned word of the allocation.
        unsafe { self.ptr.add(offset).cast::<u64>().read_volatile() }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // Never reached with a kernel still running: a wait that runs out ends the process.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: no arguments; then the allocation of cuMemHostAlloc, unused from now on.
            unsafe {
                sys::cuCtxSynchronize();
                sys::cuMemFreeHost(self.ptr.cast());
            }
        }
    }
}

/// One GPU: its kernels, two lanes (streams with their events), its buffers.
struct Side {
    device: i32,
    ctx: Arc<CudaContext>,
    kernels: Arc<DeviceKernels>,
    lanes: [(Arc<CudaStream>, Timer); 2],
    /// What its SMs push from, and (peers mode) what the other GPU pulls from.
    src: DevBuf,
    /// What its SMs pull into.
    dst: DevBuf,
    /// Peers mode: where the other GPU pushes, and the ring of its round trips.
    inbox: Option<DevBuf>,
    ring: Option<DevBuf>,
    /// The round trips' result words.
    out: HostBuf,
}

impl Side {
    fn new(device: i32, ctx: Arc<CudaContext>, bytes: u64, peers: bool) -> Res<Side> {
        let kernels = edgellm_allreduce::device_kernels(device)
            .map_err(|e| format!("loading the kernels of GPU {device}: {e}"))?;
        let lane =
            || -> Res<(Arc<CudaStream>, Timer)> { Ok((ctx.new_stream().ctx("cuStreamCreate")?, Timer::new(&ctx)?)) };
        let lanes = [lane()?, lane()?];
        let buf = |n: u64| DevBuf::new(&ctx, n as usize);
        let (inbox, ring) = if peers { (Some(buf(bytes)?), Some(buf(probe::RING_BYTES)?)) } else { (None, None) };
        Ok(Side {
            device,
            src: buf(bytes)?,
            dst: buf(bytes)?,
            inbox,
            ring,
            out: HostBuf::new(&ctx, 4096)?,
            kernels,
            lanes,
            ctx,
        })
    }

    fn stream(&self, lane: usize) -> &Arc<CudaStream> {
        &self.lanes[lane].0
    }

    fn inbox_ptr(&self) -> u64 {
        self.inbox.as_ref().expect("peers have an inbox").ptr
    }

    /// Fills `bytes` bytes of this GPU's memory at `ptr` with `value`, in lane 0's order.
    fn memset(&self, ptr: u64, value: u8, bytes: u64) -> Res<()> {
        self.ctx.bind_to_thread().ctx("binding the context")?;
        gpu::memset_async(ptr, value, bytes as usize, self.stream(0))
    }

    /// Waits for what lane 0 has queued, bounded.
    fn wait(&self, limit: Duration, what: &str) -> Res<()> {
        self.ctx.bind_to_thread().ctx("binding the context")?;
        let stop = &self.lanes[0].1.events().1;
        stop.record(self.stream(0)).ctx("cuEventRecord")?;
        wait_for(&[(self, 0)], limit, what)
    }
}

/// The far side of a link as the initiator addresses it.
struct Far<'a> {
    /// Where pushes land, where pulls read from, the round trips' ring.
    inbox: u64,
    outbox: u64,
    ring: u64,
    memory: FarMemory<'a>,
}

enum FarMemory<'a> {
    /// Host mode: the link's pinned buffer, with the inbox and outbox at these offsets.
    Host { buf: &'a HostBuf, inbox: usize, outbox: usize },
    /// Peers mode: the other GPU.
    Gpu(&'a Side),
}

/// Ends the process after a wait that ran out: see the module documentation.
fn give_up(what: &str, limit: Duration) -> ! {
    eprintln!(
        "\nerror: {what} did not finish within {:.0} s. A kernel that never ends (a load across a link that never \
         answers) cannot be stopped: the probe exits now, leaving the memory it may still touch; the lines measured \
         so far are in the CSV. In peers mode `--directions write,both` measures with no load across the link.",
        limit.as_secs_f64()
    );
    std::process::exit(3)
}

/// Waits, bounded by `limit`, for the stop event of each `(side, lane)`.
fn wait_for(lanes: &[(&Side, usize)], limit: Duration, what: &str) -> Res<()> {
    let deadline = Instant::now() + limit;
    loop {
        let mut done = true;
        for &(side, lane) in lanes {
            side.ctx.bind_to_thread().ctx("binding the context")?;
            done &= side.lanes[lane].1.events().1.try_is_complete().ctx(what)?;
        }
        if done {
            return Ok(());
        }
        if Instant::now() >= deadline {
            give_up(what, limit);
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// What a lane queues on its stream.
type Enqueue<'a> = Box<dyn Fn(&CudaStream) -> Res<()> + 'a>;

/// One lane of a timed repeat: `bytes` moved by what `enqueue` queues on its stream.
struct Lane<'a> {
    side: &'a Side,
    lane: usize,
    bytes: u64,
    enqueue: Enqueue<'a>,
}

/// `reps` copies by `ctas` CTAs of `side`'s SMs, `src` to `dst`.
fn sm_lane(side: &Side, lane: usize, src: u64, dst: u64, bytes: u64, reps: u64, ctas: u32) -> Lane<'_> {
    let enqueue = move |s: &CudaStream| {
        let stream = Stream(s.cu_stream() as usize);
        // SAFETY: both buffers hold the largest transfer and are reachable from side's context
        // (its own memory, a peer's with peer access enabled, mapped host memory).
        unsafe { probe::copy(&side.kernels, DevicePtr(src), DevicePtr(dst), bytes, reps, ctas, stream) }
            .map_err(|e| format!("GPU {}: {e}", side.device))
    };
    Lane { side, lane, bytes: bytes * reps, enqueue: Box::new(enqueue) }
}

/// `calls` copy-engine copies queued on `side`'s lane: `cuMemcpyPeerAsync` between two GPUs'
/// contexts (`peer`: the destination's and the source's), else `cuMemcpyAsync` (host memory).
fn ce_lane<'a>(
    side: &'a Side,
    lane: usize,
    (dst, src): (u64, u64),
    peer: Option<(&'a Side, &'a Side)>,
    bytes: u64,
    calls: u32,
) -> Lane<'a> {
    let enqueue = move |s: &CudaStream| {
        for _ in 0..calls {
            // SAFETY: both addresses hold the largest transfer, in the contexts named.
            let r = unsafe {
                match peer {
                    Some((d, f)) => {
                        sys::cuMemcpyPeerAsync(dst, d.ctx.cu_ctx(), src, f.ctx.cu_ctx(), bytes as usize, s.cu_stream())
                    }
                    None => sys::cuMemcpyAsync(dst, src, bytes as usize, s.cu_stream()),
                }
            };
            check(if peer.is_some() { "cuMemcpyPeerAsync" } else { "cuMemcpyAsync" }, r)?;
        }
        Ok(())
    };
    Lane { side, lane, bytes: bytes * calls as u64, enqueue: Box::new(enqueue) }
}

/// One repeat of `lanes`: GB/s of all their bytes over the slowest lane's time.
fn repeat(lanes: &[Lane], gate: Option<&Gate>, limit: Duration, what: &str) -> Res<f64> {
    let value = gate.map(Gate::next);
    let queue = || -> Res<()> {
        for l in lanes {
            l.side.ctx.bind_to_thread().ctx("binding the context")?;
            let (stream, timer) = &l.side.lanes[l.lane];
            if let (Some(g), Some(v)) = (gate, value) {
                Gate::wait(g.device_ptr()?, v, stream)?;
            }
            timer.events().0.record(stream).ctx("cuEventRecord")?;
            (l.enqueue)(stream)?;
            timer.events().1.record(stream).ctx("cuEventRecord")?;
        }
        Ok(())
    };
    let queued = queue();
    // Opened whatever happened: a lane left behind a closed gate would never end.
    if let (Some(g), Some(v)) = (gate, value) {
        g.open(v);
    }
    queued?;
    let waited: Vec<(&Side, usize)> = lanes.iter().map(|l| (l.side, l.lane)).collect();
    wait_for(&waited, limit, what)?;
    let mut slowest_ms = 0f32;
    for l in lanes {
        let (start, stop) = l.side.lanes[l.lane].1.events();
        slowest_ms = slowest_ms.max(start.elapsed_ms(stop).ctx("cuEventElapsedTime")?);
    }
    let bytes: u64 = lanes.iter().map(|l| l.bytes).sum();
    Ok(bytes as f64 / (slowest_ms as f64 * 1e-3) / 1e9)
}

/// One link's run: who initiates, what is on the far side, the sweep.
struct LinkRun<'a> {
    sweep: &'a Sweep,
    link: Link,
    a: &'a Side,
    far: Far<'a>,
    gate: Option<&'a Gate>,
}

impl LinkRun<'_> {
    fn what(&self, m: &str) -> String {
        match self.far.memory {
            FarMemory::Host { .. } => format!("{m} of GPU {} with pinned host memory", self.a.device),
            FarMemory::Gpu(b) => format!("{m} of GPU {} with GPU {}", self.a.device, b.device),
        }
    }

    /// The lanes of a transfer line.
    fn lanes(&self, m: Measure) -> Vec<Lane<'_>> {
        let (a, far, s) = (self.a, &self.far, self.sweep);
        let peer = match far.memory {
            FarMemory::Gpu(b) => Some(b),
            FarMemory::Host { .. } => None,
        };
        let write = (a.src.ptr, far.inbox);
        let read = (far.outbox, a.dst.ptr);
        match m {
            Measure::Sm { direction, bytes, ctas } => {
                let reps = s.reps(bytes);
                let sm = |side, lane, (src, dst): (u64, u64)| sm_lane(side, lane, src, dst, bytes, reps, ctas);
                match (direction, peer) {
                    (Direction::Write, _) => vec![sm(a, 0, write)],
                    (Direction::Read, _) => vec![sm(a, 0, read)],
                    (Direction::Both, None) => vec![sm(a, 0, write), sm(a, 1, read)],
                    (Direction::Both, Some(b)) => vec![sm(a, 0, write), sm(b, 0, (b.src.ptr, a.inbox_ptr()))],
                }
            }
            Measure::Ce { direction, bytes } => {
                let calls = s.ce_calls(bytes);
                let ce = |side, lane, (src, dst): (u64, u64), ctxs| ce_lane(side, lane, (dst, src), ctxs, bytes, calls);
                match (direction, peer) {
                    (Direction::Write, None) => vec![ce(a, 0, write, None)],
                    (Direction::Read, None) => vec![ce(a, 0, read, None)],
                    (Direction::Both, None) => vec![ce(a, 0, write, None), ce(a, 1, read, None)],
                    (Direction::Write, Some(b)) => vec![ce(a, 0, write, Some((b, a)))],
                    (Direction::Read, Some(b)) => vec![ce(a, 0, read, Some((a, b)))],
                    (Direction::Both, Some(b)) => {
                        vec![ce(a, 0, write, Some((b, a))), ce(b, 0, (b.src.ptr, a.inbox_ptr()), Some((a, b)))]
                    }
                }
            }
            Measure::Latency(_) => unreachable!("round trips are no transfer"),
        }
    }

    /// The median of `repeats` figures after one untimed run: GB/s, or µs per round trip.
    fn measure(&self, m: Measure) -> Res<Summary> {
        let s = self.sweep;
        let what = self.what(m.name());
        let mut values = Vec::with_capacity(s.repeats as usize);
        for i in 0..=s.repeats {
            let v = match m {
                Measure::Latency(trip) => self.round_trips(trip, s.iters, s.timeout, &what)?,
                _ => repeat(&self.lanes(m), self.gate, s.timeout, &what)?,
            };
            if i > 0 {
                values.push(v);
            }
        }
        Ok(summarize(&values))
    }

    /// µs per round trip of `iters` round trips of kind `trip`.
    fn round_trips(&self, trip: RoundTrip, iters: u32, limit: Duration, what: &str) -> Res<f64> {
        let a = self.a;
        a.ctx.bind_to_thread().ctx("binding the context")?;
        let stream = Stream(a.stream(0).cu_stream() as usize);
        // SAFETY: the ring holds RING_BYTES, 128-byte aligned (a page of the host buffer, a
        // cuMemAlloc), used by nothing else now; `out` is the side's own result page.
        unsafe { probe::latency(&a.kernels, trip, DevicePtr(self.far.ring), iters, DevicePtr(a.out.dev(0)?), stream) }
            .map_err(|e| format!("GPU {}: {e}", a.device))?;
        a.wait(limit, what)?;
        Ok(a.out.word(0) as f64 / iters as f64 / 1e3)
    }

    /// Copies CHECK_BYTES of `pattern` across the link (`write`: pushed, else pulled) and
    /// compares: None when every byte arrived, else how many differ.
    fn arrives(&self, write: bool, n: u64) -> Res<Option<usize>> {
        let (a, far) = (self.a, &self.far);
        let pattern = if write { WRITE_PATTERN } else { READ_PATTERN };
        let limit = self.sweep.timeout;
        let what = self.what(if write { "the write check" } else { "the read check" });
        // The source holds the pattern, the destination zeros.
        if write {
            a.memset(a.src.ptr, pattern, n)?;
            match far.memory {
                FarMemory::Host { buf, inbox, .. } => buf.fill(inbox, n as usize, 0),
                FarMemory::Gpu(b) => {
                    b.memset(b.inbox_ptr(), 0, n)?;
                    b.wait(limit, &what)?;
                }
            }
        } else {
            a.memset(a.dst.ptr, 0, n)?;
            match far.memory {
                FarMemory::Host { buf, outbox, .. } => buf.fill(outbox, n as usize, pattern),
                FarMemory::Gpu(b) => {
                    b.memset(b.src.ptr, pattern, n)?;
                    b.wait(limit, &what)?;
                }
            }
        }
        let (src, dst) = if write { (a.src.ptr, far.inbox) } else { (far.outbox, a.dst.ptr) };
        let ctas = *self.sweep.ctas.last().expect("CTA counts");
        a.ctx.bind_to_thread().ctx("binding the context")?;
        (sm_lane(a, 0, src, dst, n, 1, ctas).enqueue)(a.stream(0))?;
        a.wait(limit, &what)?;
        let got = match (write, &far.memory) {
            (true, FarMemory::Host { buf, inbox, .. }) => buf.read(*inbox, n as usize),
            (true, FarMemory::Gpu(b)) => b.inbox.as_ref().expect("peers have an inbox").download(n as usize)?,
            (false, _) => a.dst.download(n as usize)?,
        };
        let wrong = got.iter().filter(|&&v| v != pattern).count();
        Ok((wrong > 0).then_some(wrong))
    }

    /// Every line of the link, printed and written as it is measured; false if bytes did not
    /// arrive intact.
    fn run(&self, both: bool, csv: &mut csv::Writer<std::fs::File>, rows: &mut Vec<Row>) -> Res<bool> {
        let s = self.sweep;
        let measures = s.measures(both);
        let n = CHECK_BYTES.min(*s.sizes.last().expect("sizes"));
        let mut intact = true;
        let mut say = |write: bool, wrong: Option<usize>| {
            let (how, path) = if write { ("SM stores", "written") } else { ("SM loads", "read") };
            match wrong {
                None => println!("  check: {} {path} by {how} arrived intact", fmt_bytes(n)),
                Some(w) => {
                    intact = false;
                    println!("  check: WRONG: {w} of {} bytes {path} by {how} differ: this direction's figures are not of a working link", n);
                }
            }
        };
        if measures.iter().any(|m| matches!(m, Measure::Sm { direction: Direction::Write | Direction::Both, .. })) {
            say(true, self.arrives(true, n)?);
        }
        if measures.iter().any(|m| m.reads(s.mode)) {
            self.round_trips(
                RoundTrip::Load,
                READ_CHECK_ITERS,
                READ_CHECK,
                &self.what("the first loads across the link"),
            )?;
            say(false, self.arrives(false, n)?);
        }
        for m in measures {
            let row = Row { link: self.link, measure: m, value: self.measure(m)? };
            println!("{}", line(&row));
            csv.serialize(CsvRow::new(s.mode, &row, s.repeats)).map_err(|e| format!("writing the CSV: {e}"))?;
            csv.flush().map_err(|e| format!("writing the CSV: {e}"))?;
            rows.push(row);
        }
        Ok(intact)
    }
}

/// What the table says of a GPU: its name and PCI bus id.
struct Gpu {
    name: String,
    bus_id: String,
}

fn bus_id(ctx: &CudaContext) -> String {
    let mut id = [0 as std::ffi::c_char; 32];
    // SAFETY: a buffer of the length given; the driver NUL-terminates it.
    match unsafe { sys::cuDeviceGetPCIBusId(id.as_mut_ptr(), id.len() as i32, ctx.cu_device()) } {
        // SAFETY: NUL-terminated by the driver.
        sys::CUresult::CUDA_SUCCESS => unsafe { std::ffi::CStr::from_ptr(id.as_ptr()) }.to_string_lossy().into_owned(),
        _ => "bus id unknown".into(),
    }
}

/// Peer access from `a` to `b`'s memory: Ok(false) when the driver has none.
fn enable_peer(a: &CudaContext, b: &CudaContext) -> Res<bool> {
    let mut can = 0;
    // SAFETY: a valid out-pointer, two devices of this driver.
    check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()) })?;
    if can == 0 {
        return Ok(false);
    }
    a.bind_to_thread().ctx("binding the context")?;
    // SAFETY: b's context is alive; no flags.
    match unsafe { sys::cuCtxEnablePeerAccess(b.cu_ctx(), 0) } {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        e => Err(format!("cuCtxEnablePeerAccess: {e:?}")),
    }
}

/// Runs the probe; the exit status: 0, 1 (bytes did not arrive intact), 2 (an error), 3 (a wait
/// ran out, see [`give_up`]).
pub fn run(args: ProbeArgs) -> i32 {
    match probe(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

fn probe(args: &ProbeArgs) -> Res<i32> {
    let gpus = gpu::device_count();
    if gpus == 0 {
        return Err("no CUDA device (or no libcuda)".into());
    }
    let mode = args.mode(gpus);
    let devices = args.devices(mode, gpus)?;
    let ctxs: Vec<Arc<CudaContext>> = devices.iter().map(|&d| gpu::context(d as usize)).collect::<Res<_>>()?;
    let sm_attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    let sms = ctxs.iter().map(|c| c.attribute(sm_attribute).ctx("the SM count")).collect::<Res<Vec<i32>>>()?;
    let sweep = args.resolve(mode, devices.clone(), sms.iter().copied().min().unwrap_or(1).max(1) as u32)?;
    let info: Vec<Gpu> = ctxs.iter().map(|c| Gpu { name: gpu::device_name(c), bus_id: bus_id(c) }).collect();
    let index = |d: i32| devices.iter().position(|&x| x == d).expect("a probed device");
    let describe = |d: i32| format!("{}, {}", info[index(d)].name, info[index(d)].bus_id);

    println!(
        "edgellm-allreduce-bench probe: mode {}{}; SM copies of {} threads a CTA, CTAs {:?}, sizes {}; {} timed repeats a line (median, p10, p90) after one untimed; an SM line moves {} a repeat",
        mode.name(),
        if mode == LinkMode::Host { " (GPU <-> pinned host memory over PCIe, not GPU-to-GPU)" } else { "" },
        probe::THREADS,
        sweep.ctas,
        sweep.sizes.iter().map(|&b| fmt_bytes(b)).collect::<Vec<_>>().join(", "),
        sweep.repeats,
        fmt_bytes(sweep.target_bytes),
    );
    for (&d, g) in devices.iter().zip(&info) {
        println!("GPU {d}: {} ({}), {} SMs", g.name, g.bus_id, sms[index(d)]);
    }

    let max = *sweep.sizes.last().expect("sizes");
    let sides: Vec<Side> = devices
        .iter()
        .zip(&ctxs)
        .map(|(&d, c)| Side::new(d, c.clone(), max, mode == LinkMode::Peers))
        .collect::<Res<_>>()?;
    ctxs[0].bind_to_thread().ctx("binding the context")?;
    let gate = Gate::new()?;
    let waits = sides.iter().try_for_each(|s| {
        s.ctx.bind_to_thread().ctx("binding the context")?;
        gate.probe(s.stream(0)).map(|_| ())
    });
    let gate = match waits {
        Ok(()) => Some(gate),
        Err(e) => {
            println!("note: no start gate ({e}): each repeat starts as it is queued");
            None
        }
    };
    let file = std::fs::File::create(&args.csv).map_err(|e| format!("creating {}: {e}", args.csv.display()))?;
    let mut csv = csv::Writer::from_writer(file);

    let mut rows: Vec<Row> = Vec::new();
    let mut links: Vec<(Link, String)> = Vec::new();
    let mut intact = true;
    for (i, a) in sides.iter().enumerate() {
        match mode {
            LinkMode::Host => {
                // Inbox, outbox, then the ring, each page-aligned.
                let page = |b: u64| b.div_ceil(4096) * 4096;
                let (inbox, outbox, ring) = (0, page(max) as usize, 2 * page(max) as usize);
                let buf = HostBuf::new(&a.ctx, ring + probe::RING_BYTES as usize)?;
                let far = Far {
                    inbox: buf.dev(inbox)?,
                    outbox: buf.dev(outbox)?,
                    ring: buf.dev(ring)?,
                    memory: FarMemory::Host { buf: &buf, inbox, outbox },
                };
                let link = Link { from: a.device, to: Target::Host };
                let title = link_title(link, &describe, None);
                println!("\n{title}");
                let run = LinkRun { sweep: &sweep, link, a, far, gate: gate.as_ref() };
                intact &= run.run(true, &mut csv, &mut rows)?;
                links.push((link, title));
            }
            LinkMode::Peers => {
                for (j, b) in sides.iter().enumerate().filter(|&(j, _)| j != i) {
                    let link = Link { from: a.device, to: Target::Gpu(b.device) };
                    if !(enable_peer(&a.ctx, &b.ctx)? && enable_peer(&b.ctx, &a.ctx)?) {
                        if i < j {
                            println!(
                                "\nGPU {} and GPU {}: no peer access both ways (cuDeviceCanAccessPeer): skipped",
                                a.device, b.device
                            );
                        }
                        continue;
                    }
                    let class = edgellm_allreduce::link_facts(a.device, b.device).class.name();
                    let title = link_title(link, &describe, Some(class));
                    println!("\n{title}");
                    let ring = b.ring.as_ref().expect("peers have a ring").ptr;
                    let far = Far { inbox: b.inbox_ptr(), outbox: b.src.ptr, ring, memory: FarMemory::Gpu(b) };
                    let run = LinkRun { sweep: &sweep, link, a, far, gate: gate.as_ref() };
                    intact &= run.run(i < j, &mut csv, &mut rows)?;
                    links.push((link, title));
                }
            }
        }
    }

    println!(
        "\nsummary ({} mode; PCIe links from sysfs, read after the sweep: GPUs slow an idle link down)",
        mode.name()
    );
    for (link, title) in &links {
        println!("{title}");
        let mut raw = None;
        for d in std::iter::once(link.from).chain(match link.to {
            Target::Gpu(b) => Some(b),
            Target::Host => None,
        }) {
            match pcie_link(&info[index(d)].bus_id) {
                Some((now, max)) => {
                    let max = max.filter(|m| *m != now).map(|m| format!(" (max {})", m.describe())).unwrap_or_default();
                    println!(
                        "  PCIe link of GPU {d}: {}{max}, {:.1} GB/s raw each way",
                        now.describe(),
                        now.raw_gbps()
                    );
                    raw = raw.or(Some(now.raw_gbps()));
                }
                None => println!("  PCIe link of GPU {d}: not readable from sysfs"),
            }
        }
        // Only host mode's figures all cross one PCIe link: a peer's may take NVLink.
        let limit = |m: Measure| {
            let both = matches!(
                m,
                Measure::Sm { direction: Direction::Both, .. } | Measure::Ce { direction: Direction::Both, .. }
            );
            raw.filter(|_| link.to == Target::Host).map(|r| if both { 2.0 * r } else { r })
        };
        let of: Vec<Row> = rows.iter().filter(|r| r.link == *link).cloned().collect();
        print!("{}", summary(&of, &limit));
    }
    println!("\nCSV: {}", args.csv.display());
    if !intact {
        eprintln!("bytes copied across a link did not arrive intact (the `check: WRONG` lines)");
    }
    Ok(if intact { 0 } else { 1 })
}
