//! Simulation mode: N ranks on one GPU (`Group::simulated`), each rank's kernel on its own
//! stream; one all-reduce = the N rank streams forked from and joined back to one origin
//! stream (events), captured as ONE graph. The ranks share one GPU's memory and SMs (no
//! NVLink): this measures the kernels' protocol costs and memory efficiency, not a real
//! interconnect. `floor` is the same fork/join graph with an empty kernel per rank stream in
//! place of the kernels (a 1-byte memset where the driver cannot JIT the empty kernel's PTX):
//! the cost of the method itself. `copy` is the roofline: a large
//! device-to-device copy, counting bytes read plus written. The fused sweep (all-reduce +
//! residual + RMSNorm) uses the same groups, streams and fork/join: one fused op per graph.

use crate::case::{fused_call, grid_ctas, grid_name, path_name, plain_call, Case, Shape};
use crate::fused::{self, FusedBufs, FusedOp};
use crate::gpu::{self, capture, memset_async, watchdog, Context, DevBuf, Gate, Res, Timer, GATE_MAX_CALLS};
use crate::measure::{self, Fatal, Gated, Measured, Runner, Settings, Sink, Solo};
use crate::record::{Record, Status, COPY, FLOOR};
use crate::stats::{self, fmt_bytes};
use crate::Plan;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use edgellm_allreduce::{
    self as ear, DataType, DeviceKernels, DevicePtr, Family, Fits, Group, Path, Requested, Stream,
};
use edgellm_test_support::{self as data, dtype_name, OutputCheck};
use std::sync::{Arc, Mutex};

/// N simulated ranks and their streams and buffers.
struct Sim {
    group: Group,
    origin: Arc<CudaStream>,
    streams: Vec<Arc<CudaStream>>,
    fork: CudaEvent,
    joins: Vec<CudaEvent>,
    inputs: Vec<DevBuf>,
    outputs: Vec<DevBuf>,
}

impl Sim {
    fn new(
        ctx: &Arc<CudaContext>,
        origin: &Arc<CudaStream>,
        device: i32,
        nranks: i32,
        ws_bytes: u64,
        buf_bytes: usize,
    ) -> Res<Sim> {
        let group =
            Group::simulated(device, nranks, ws_bytes).map_err(|e| format!("Group::simulated({nranks} ranks): {e}"))?;
        let n = nranks as usize;
        let streams = (0..n).map(|_| ctx.new_stream().ctx("cuStreamCreate")).collect::<Res<Vec<_>>>()?;
        let joins = (0..n).map(|_| ctx.new_event(None).ctx("cuEventCreate")).collect::<Res<Vec<_>>>()?;
        Ok(Sim {
            group,
            origin: origin.clone(),
            streams,
            fork: ctx.new_event(None).ctx("cuEventCreate")?,
            joins,
            inputs: (0..n).map(|_| DevBuf::new(ctx, buf_bytes)).collect::<Res<_>>()?,
            outputs: (0..n).map(|_| DevBuf::new(ctx, buf_bytes)).collect::<Res<_>>()?,
        })
    }

    /// Fork from the origin stream, `body(rank, stream)` on every rank stream, join back.
    fn fork_join(&self, body: impl Fn(usize, &CudaStream) -> Res<()>) -> Res<()> {
        self.fork.record(&self.origin).ctx("cuEventRecord")?;
        for (rank, s) in self.streams.iter().enumerate() {
            s.wait(&self.fork).ctx("cuStreamWaitEvent")?;
            body(rank, s)?;
            self.joins[rank].record(s).ctx("cuEventRecord")?;
            self.origin.wait(&self.joins[rank]).ctx("cuStreamWaitEvent")?;
        }
        Ok(())
    }
}

/// One row's runner: a family on every simulated rank.
struct SimRun<'a> {
    sim: &'a Sim,
    family: Family,
    /// At most this many CTAs (`Group::launch_with_ctas`); None: `Group::launch`'s cap.
    ctas: Option<u32>,
    dtype: DataType,
    count: usize,
    reference: &'a [f64],
}

impl Runner for SimRun<'_> {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.sim.origin
    }
    fn poison(&self) -> Res<()> {
        let bytes = self.count * self.dtype.size();
        self.sim.outputs.iter().try_for_each(|o| memset_async(o.ptr, data::POISON, bytes, &self.sim.origin))
    }
    fn enqueue(&self) -> Res<()> {
        let (sim, count) = (self.sim, self.count);
        sim.fork_join(|rank, s| {
            let (input, output) = (DevicePtr(sim.inputs[rank].ptr), DevicePtr(sim.outputs[rank].ptr));
            let (family, dtype, stream) = (self.family, self.dtype, Stream(s.cu_stream() as usize));
            // SAFETY: the buffers hold `count` elements and are 256-byte aligned; every rank of
            // the group gets the same call (and grid), in the same order.
            unsafe {
                match self.ctas {
                    Some(c) => sim.group.launch_with_ctas(rank as i32, family, dtype, input, output, count, stream, c),
                    None => sim.group.launch(rank as i32, family, dtype, input, output, count, stream),
                }
            }
            .map_err(|e| format!("launch of rank {rank}: {e}"))
        })
    }
    fn check(&self) -> Res<Vec<OutputCheck>> {
        let bytes = self.count * self.dtype.size();
        let outs = self.sim.outputs.iter().map(|o| o.download(bytes)).collect::<Res<Vec<_>>>()?;
        Ok(std::thread::scope(|s| {
            let handles: Vec<_> =
                outs.iter().map(|o| s.spawn(|| data::check_output(o, self.reference, self.dtype))).collect();
            handles.into_iter().map(|h| h.join().expect("check thread")).collect()
        }))
    }
}

/// One fused row's runner: a custom fused op on every simulated rank.
struct SimFusedRun<'a> {
    sim: &'a Sim,
    bufs: &'a [FusedBufs],
    op: FusedOp,
    /// The plain all-reduce's grid of a split op (`Plan::ctas`).
    ctas: Option<u32>,
    dtype: DataType,
    shape: Shape,
    eps: f32,
    kernels: &'a DeviceKernels,
    reference: &'a (Vec<f64>, Vec<f64>),
}

impl Runner for SimFusedRun<'_> {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.sim.origin
    }
    fn poison(&self) -> Res<()> {
        let bytes = self.shape.bytes(self.dtype) as usize;
        self.bufs.iter().try_for_each(|b| b.poison(bytes, &self.sim.origin))
    }
    fn enqueue(&self) -> Res<()> {
        let sim = self.sim;
        sim.fork_join(|rank, s| {
            // SAFETY: the buffers hold the shape (fresh allocations: aligned); every rank of
            // the group gets the same call, in the same order.
            unsafe {
                fused::enqueue_custom(
                    &sim.group,
                    rank,
                    self.op,
                    self.dtype,
                    &self.bufs[rank],
                    &self.shape,
                    self.eps,
                    self.kernels,
                    s.cu_stream() as usize,
                    self.ctas,
                )
            }
        })
    }
    fn check(&self) -> Res<Vec<OutputCheck>> {
        let bytes = self.shape.bytes(self.dtype) as usize;
        let outs = self.bufs.iter().map(|b| b.download(bytes)).collect::<Res<Vec<_>>>()?;
        Ok(fused::check_all(&outs, self.reference, self.dtype))
    }
}

/// Times `launch` alone (one thread, no checks), gated as the rows are: the per-call µs summary.
fn time_alone(
    stream: &CudaStream,
    timer: &Timer,
    s: &Settings,
    ops: u32,
    gate: Option<Gated>,
    launch: &dyn Fn() -> Res<()>,
) -> Res<stats::Summary> {
    let gate = gate.filter(|_| s.replays <= GATE_MAX_CALLS);
    let mut times = Vec::new();
    for b in 0..s.warmup + s.batches {
        let (start, stop) = timer.events();
        let value = gate.map(|g| g.gate.next());
        if let (Some(g), Some(v)) = (gate, value) {
            Gate::wait(g.device_ptr, v, stream)?;
        }
        let enqueued =
            start.record(stream).ctx("cuEventRecord").and_then(|_| (0..s.replays).try_for_each(|_| launch()));
        if let (Some(g), Some(v)) = (gate, value) {
            g.gate.open(v);
        }
        enqueued?;
        stop.record(stream).ctx("cuEventRecord")?;
        let us = timer.wait_per_call_us(s.replays * ops)?;
        if b >= s.warmup {
            times.push(us);
        }
        watchdog::tick();
    }
    Ok(stats::summarize(&times))
}

/// The copy roofline: bytes of a large device-to-device copy (read + written) per second.
fn roofline(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    timer: &Timer,
    s: &Settings,
    gate: Option<Gated>,
) -> Res<(u64, stats::Summary, f64)> {
    let (free, _) = ctx.mem_get_info().ctx("cuMemGetInfo")?;
    let bytes = (256usize << 20).min(free / 8).max(1 << 20);
    let (src, dst) = (DevBuf::new(ctx, bytes)?, DevBuf::new(ctx, bytes)?);
    memset_async(src.ptr, 0x3c, bytes, stream)?;
    let copy = || {
        // SAFETY: both buffers hold `bytes` bytes of this device.
        gpu::check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, bytes, stream.cu_stream())
        })
    };
    let graph = capture(stream, copy)?;
    let settings = Settings { replays: s.replays.min(20), ..*s };
    let t = time_alone(stream, timer, &settings, 1, gate, &|| graph.launch().ctx("cuGraphLaunch"))?;
    stream.synchronize().ctx("synchronize")?;
    Ok((bytes as u64, t, 2.0 * bytes as f64 / (t.median * 1e-6) / 1e9))
}

enum Step {
    /// The family, at most this many CTAs (None: `Group::launch`'s cap).
    Run(Family, Option<u32>),
    Skip(String),
}

/// What a row runs at this size, or why it cannot (`plan_`: the grids it takes).
fn plan(case: Case, group: &Group, dtype: DataType, bytes: u64, plan_: &Plan) -> Step {
    let serve = |f: Family, ctas: Option<u32>| {
        if group.serves_bytes(f, dtype, bytes) {
            Step::Run(f, ctas)
        } else {
            Step::Skip(format!(
                "{} serves up to {} with this workspace",
                Case::Custom(f).name(),
                fmt_bytes(f.max_bytes(group.max_bytes))
            ))
        }
    };
    match case {
        Case::Custom(f) => serve(f, plan_.ctas(group.nranks, f)),
        Case::Grid(f, ctas) => match grid_ctas(ctas, group.max_blocks) {
            Ok(c) => serve(f, Some(c)),
            Err(why) => Step::Skip(why),
        },
        Case::Auto => {
            let call = plain_call(group.nranks, dtype, bytes);
            match ear::choose(Requested::Auto, &call, Some(group as &dyn Fits)).path {
                Path::Custom(f) => Step::Run(f, None),
                p => Step::Skip(format!("AUTO picks {} here (no NCCL in simulation)", path_name(p))),
            }
        }
        Case::Nccl | Case::Plugin => Step::Skip("real mode only".into()),
        _ => Step::Skip("a fused row".into()),
    }
}

/// What a fused row runs at this shape, or why it cannot.
fn plan_fused(case: Case, group: &Group, dtype: DataType, shape: &Shape) -> Result<FusedOp, String> {
    let call = fused_call(group.nranks, dtype, shape);
    let cap = Some(group as &dyn Fits);
    match case {
        Case::Fused(f) if group.serves(f, dtype, &call.message) => Ok(FusedOp::Fused(f)),
        Case::Fused(f) => Err(format!(
            "{} does not take {} rows of {} with this workspace ({})",
            case.name(),
            shape.tokens,
            shape.hidden,
            fmt_bytes(f.max_bytes(group.max_bytes))
        )),
        Case::FusedAuto => match ear::choose(Requested::Auto, &call, cap).path {
            Path::Custom(f) => Ok(FusedOp::Fused(f)),
            Path::Split(f) => Ok(FusedOp::ArThenNorm(f)),
            p => Err(format!("AUTO picks {} then the norm kernel here (no NCCL in simulation)", path_name(p))),
        },
        Case::ArThenNorm => {
            match ear::choose(Requested::Auto, &plain_call(group.nranks, dtype, call.message.bytes), cap).path {
                Path::Custom(f) => Ok(FusedOp::ArThenNorm(f)),
                p => Err(format!("AUTO picks {} for the plain all-reduce here (no NCCL in simulation)", path_name(p))),
            }
        }
        Case::Split(f) if group.serves_bytes(f, dtype, call.message.bytes) => Ok(FusedOp::ArThenNorm(f)),
        Case::Split(f) => Err(format!(
            "{} serves up to {} with this workspace",
            Case::Custom(f).name(),
            fmt_bytes(f.max_bytes(group.max_bytes))
        )),
        Case::NcclThenNorm | Case::PluginFused => Err("real mode only".into()),
        _ => Err("not a fused row".into()),
    }
}

/// The fused sweep of one rank count: per (dtype, shape) fresh inputs, the fp64 references,
/// then every fused row.
#[allow(clippy::too_many_arguments)]
fn fused_sweep(
    plan_: &Plan,
    sim: &Sim,
    ctx: &Arc<CudaContext>,
    n: i32,
    sub: &str,
    timer: &Timer,
    gated: Option<Gated>,
    sink: &Mutex<Sink>,
) -> Result<(), Fatal> {
    let fatal = |e: String| Fatal(e);
    let s = &plan_.settings;
    let max_elem = plan_.dtypes.iter().map(|d| d.size()).max().unwrap_or(2);
    let max_bytes = plan_.shapes.iter().map(|sh| sh.count() * max_elem).max().unwrap_or(16);
    let max_row = plan_.shapes.iter().map(|sh| sh.hidden as usize * max_elem).max().unwrap_or(16);
    let setup = || -> Res<(Arc<DeviceKernels>, Vec<FusedBufs>)> {
        let kernels =
            edgellm_allreduce::device_kernels(plan_.device).map_err(|e| format!("loading the kernels: {e}"))?;
        let bufs = (0..n).map(|_| FusedBufs::new(ctx, max_bytes, max_row)).collect::<Res<Vec<_>>>()?;
        Ok((kernels, bufs))
    };
    let (kernels, bufs) = match setup() {
        Ok(x) => x,
        Err(e) => {
            let mut sink = sink.lock().unwrap();
            for (dtype, bytes, case, shape) in plan_.rows(true) {
                let mut r = Record::new("sim", n, dtype_name(dtype), bytes, case.name(), sub);
                (r.status, r.note, r.shape) = (Status::Error, e.clone(), shape);
                sink.push(r, true);
            }
            return Ok(());
        }
    };
    let eps = fused::eps();
    for &dtype in &plan_.dtypes {
        for shape in &plan_.shapes {
            let (count, bytes) = (shape.count(), shape.bytes(dtype));
            let label = format!("sim {n} ranks {} {}", dtype_name(dtype), shape.label());
            sink.lock().unwrap().message(format!("{label}: data"));
            sink.lock().unwrap().step(label.clone());
            let shared = data::shared_inputs(n, dtype, shape.tokens, shape.hidden, shape.bias);
            let mut sum = vec![0f64; count];
            for (rank, b) in bufs.iter().enumerate() {
                let x = data::generate(count, dtype, data::seed(n, bytes, rank), Some(&mut sum));
                b.upload(&x, &shared).map_err(fatal)?;
            }
            let reference = data::fused_reference(&sum, &shared, shape.hidden, eps);
            drop(sum);
            for &case in &plan_.fused_cases {
                let mut r = Record::new("sim", n, dtype_name(dtype), bytes, case.name(), sub);
                r.shape = shape.label();
                match plan_fused(case, &sim.group, dtype, shape) {
                    Err(why) => r.note = why,
                    Ok(op) => {
                        sink.lock().unwrap().message(format!("{label} {}", case.name()));
                        r.path = fused::path_of(op).into();
                        let ctas = match op {
                            FusedOp::ArThenNorm(f) => plan_.ctas(n, f),
                            _ => None,
                        };
                        let runner = SimFusedRun {
                            sim,
                            bufs: &bufs,
                            op,
                            ctas,
                            dtype,
                            shape: *shape,
                            eps,
                            kernels: &kernels,
                            reference: &reference,
                        };
                        let m: Measured = measure::measure(&runner, &Solo, timer, s, gated)?;
                        // No roofline fraction: the fused op moves more than the all-reduce's
                        // nominal traffic.
                        m.fill(&mut r, s, None);
                    }
                }
                sink.lock().unwrap().push(r, true);
            }
        }
    }
    sim.origin.synchronize().ctx("synchronize").map_err(fatal)?;
    Ok(())
}

pub fn run(plan_: &Plan, sink: &Mutex<Sink>) -> Result<(), Fatal> {
    let fatal = |e: String| Fatal(e);
    let s = &plan_.settings;
    let ctx = gpu::context(plan_.device as usize).map_err(fatal)?;
    let device = format!("GPU {} {}", plan_.device, gpu::device_name(&ctx));
    let origin = ctx.new_stream().ctx("cuStreamCreate").map_err(fatal)?;
    let timer = Timer::new(&ctx).map_err(fatal)?;
    let gate = if !s.profiler {
        Gate::new().and_then(|g| g.probe(&origin).map(|d| (g, d)))
    } else {
        Err("--profiler".to_string())
    };
    if let Err(e) = &gate {
        sink.lock().unwrap().say(format!(
            "warning: no start gate ({e}): batches run ungated, small sizes may be bound by the host's launch rate"
        ));
    }
    let gated = gate.as_ref().ok().map(|(g, d)| Gated { gate: g, device_ptr: *d });
    let empty = gpu::EmptyKernel::new(&ctx);
    sink.lock().unwrap().message("copy roofline".into());
    let (copy_bytes, copy_t, roof) = roofline(&ctx, &origin, &timer, s, gated).map_err(fatal)?;
    sink.lock()
        .unwrap()
        .say(format!("{device}: copy roofline {roof:.0} GB/s (read + write of {})", fmt_bytes(copy_bytes)));
    let buf_bytes = plan_.sizes.iter().max().map_or(1, |&b| b as usize);

    for &n in &plan_.ranks {
        // Rounded as the library rounds EDGELLM_ALLREDUCE_WORKSPACE_BYTES.
        let ws = plan_.workspace_bytes.map_or_else(|| ear::max_message_bytes(n), |b| b.div_ceil(16) * 16);
        sink.lock().unwrap().message(format!("sim {n} ranks: setting up"));
        let sim = match Sim::new(&ctx, &origin, plan_.device, n, ws, buf_bytes) {
            Ok(sim) => sim,
            Err(e) => {
                let mut sink = sink.lock().unwrap();
                for (dtype, bytes, case, shape) in plan_.rows(false).into_iter().chain(plan_.rows(true)) {
                    let mut r = Record::new("sim", n, dtype_name(dtype), bytes, case.name(), &device);
                    (r.status, r.note, r.shape) = (Status::Error, e.clone(), shape);
                    sink.push(r, true);
                }
                continue;
            }
        };
        let sub = format!("{device}, {n} ranks × grid ≤ {} CTAs, workspace {}", sim.group.max_blocks, fmt_bytes(ws));
        // The floor of the method: fork, an empty kernel (else a 1-byte memset) per rank stream, join.
        sink.lock().unwrap().message(format!("sim {n} ranks: floor"));
        let floor = (|| {
            let graph = capture(&origin, || {
                (0..s.graph_ops).try_for_each(|_| {
                    sim.fork_join(|rank, st| match &empty {
                        Ok(k) => k.launch(st),
                        Err(_) => memset_async(sim.outputs[rank].ptr, 0, 1, st),
                    })
                })
            })?;
            time_alone(&origin, &timer, s, s.graph_ops, gated, &|| graph.launch().ctx("cuGraphLaunch"))
        })();
        for dtype in &plan_.dtypes {
            let mut sink = sink.lock().unwrap();
            let mut f = Record::new("sim", n, dtype_name(*dtype), 0, FLOOR, &sub);
            f.path = match &empty {
                Ok(_) => "fork/join + empty kernel per rank".into(),
                Err(e) => format!("fork/join + 1-byte memset per rank (no empty kernel: {e})"),
            };
            match &floor {
                Ok(t) => {
                    f.status = Status::Ok;
                    (f.median_us, f.p10_us, f.p90_us) = (Some(t.median), Some(t.p10), Some(t.p90));
                }
                Err(e) => {
                    f.status = Status::Error;
                    f.note = e.clone();
                }
            }
            (f.replays, f.batches, f.graph_ops) = (s.replays, s.batches, s.graph_ops);
            sink.push(f, false);
            let mut c = Record::new("sim", n, dtype_name(*dtype), copy_bytes, COPY, &sub);
            c.status = Status::Ok;
            c.path = "cuMemcpyDtoDAsync, read + write".into();
            (c.median_us, c.p10_us, c.p90_us, c.algbw_gbps) =
                (Some(copy_t.median), Some(copy_t.p10), Some(copy_t.p90), Some(roof));
            (c.replays, c.batches) = (s.replays.min(20), s.batches);
            sink.push(c, false);
        }

        for &dtype in &plan_.dtypes {
            for &bytes in &plan_.sizes {
                let count = bytes as usize / dtype.size();
                let label = format!("sim {n} ranks {} {}", dtype_name(dtype), fmt_bytes(bytes));
                sink.lock().unwrap().message(format!("{label}: data"));
                sink.lock().unwrap().step(label.clone());
                let mut reference = vec![0f64; count];
                for (rank, input) in sim.inputs.iter().enumerate() {
                    let bytes_ = data::generate(count, dtype, data::seed(n, bytes, rank), Some(&mut reference));
                    input.upload(&bytes_).map_err(fatal)?;
                }
                for &case in &plan_.cases {
                    let mut r = Record::new("sim", n, dtype_name(dtype), bytes, case.name(), &sub);
                    match plan(case, &sim.group, dtype, bytes, plan_) {
                        Step::Skip(why) => {
                            r.note = why;
                            sink.lock().unwrap().push(r, true);
                        }
                        Step::Run(family, ctas) => {
                            sink.lock().unwrap().message(format!("{label} {}", case.name()));
                            r.path = match (case, ctas) {
                                (Case::Grid(..), Some(c)) => grid_name(family, c),
                                _ => Case::Custom(family).name().into(),
                            };
                            let runner = SimRun { sim: &sim, family, ctas, dtype, count, reference: &reference };
                            let m: Measured = measure::measure(&runner, &Solo, &timer, s, gated)?;
                            m.fill(&mut r, s, Some(roof));
                            sink.lock().unwrap().push(r, true);
                        }
                    }
                }
            }
        }
        sim.origin.synchronize().ctx("synchronize").map_err(fatal)?;
        if !plan_.fused_cases.is_empty() {
            fused_sweep(plan_, &sim, &ctx, n, &sub, &timer, gated, sink)?;
        }
    }
    Ok(())
}
