//! Real mode: one GPU per rank, one thread per GPU, in this process (Edge-LLM's single-process
//! multi-GPU mode). Rows: NCCL called directly, each custom family through an in-process
//! group (`Group::in_process`), AUTO's pick, and the plugin path (`PluginCore::enqueue` after
//! registering the NCCL communicators, which forms the plugin's own group, as a TensorRT
//! runtime does). Each device captures its own graph; a batch starts on every device after a
//! barrier and the batch's time is its slowest device's. The fused sweep (all-reduce, residual,
//! RMSNorm) runs after the plain one on the same threads, groups and communicators: the fused
//! families, AUTO's pick, AUTO's plain all-reduce then the norm kernel, NCCL then the norm
//! kernel, and a fused plugin's enqueue.

use crate::case::{fused_call, grid_ctas, grid_name, path_name, plain_call, Case, Shape};
use crate::fused::{self, FusedBufs, FusedOp};
use crate::gpu::{self, memset_async, Context, DevBuf, Gate, Res, Timer};
use crate::measure::{self, Fatal, Gated, Meeting, Member, Runner, Sink, Team};
use crate::nccl::Nccl;
use crate::record::{Record, Status};
use crate::stats::fmt_bytes;
use crate::Plan;
use cudarc::driver::{CudaContext, CudaStream};
use edgellm_allreduce::{
    self as ear, abi, DataType, DeviceKernels, DevicePtr, Family, Fits, FusionOp, Group, Path, PluginConfig,
    PluginCore, Requested, Stream, TensorDesc,
};
use edgellm_test_support::{self as data, dtype_name, trt_code, OutputCheck};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, RwLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Launch {
    Nccl,
    /// A family, at most this many CTAs (`Group::launch_with_ctas`; None: `Group::launch`'s cap).
    Custom(Family, Option<u32>),
    Plugin,
}

/// What the threads of one rank count share.
struct Shared<'a> {
    plan: &'a Plan,
    nranks: i32,
    devices: Vec<i32>,
    ctxs: Vec<Arc<CudaContext>>,
    meeting: Meeting,
    reference: RwLock<Vec<f64>>,
    /// The fused sweep's references of the current (dtype, shape): (residual_out, normed).
    fused_reference: RwLock<(Vec<f64>, Vec<f64>)>,
    /// The direct rows' group, or why there is none.
    group: Result<Group, String>,
    nccl: Option<&'a Nccl>,
    /// One communicator per rank, or why there are none.
    comms: Result<Vec<usize>, String>,
    /// Whether the communicators are registered with the plugin library.
    registered: bool,
    sink: &'a Mutex<Sink>,
    label: String,
    /// The start gate of the timed batches (None: ungated).
    gate: Option<Gate>,
}

impl Shared<'_> {
    fn capability(&self) -> Option<&dyn Fits> {
        self.group.as_ref().ok().map(|g| g as &dyn Fits)
    }

    /// What a row runs at this size (and the path it takes), or why it cannot run.
    fn plan(&self, case: Case, dtype: DataType, bytes: u64) -> Result<(Launch, String), String> {
        let nccl = || match &self.comms {
            Ok(_) => Ok((Launch::Nccl, "nccl".to_owned())),
            Err(e) => Err(e.clone()),
        };
        let call = plain_call(self.nranks, dtype, bytes);
        let custom = |f: Family, ctas: Option<u32>, path: String| match &self.group {
            Err(e) => Err(e.clone()),
            Ok(g) if g.serves_bytes(f, dtype, bytes) => Ok((Launch::Custom(f, ctas), path)),
            Ok(g) => Err(format!(
                "{} serves up to {} with this workspace",
                Case::Custom(f).name(),
                fmt_bytes(f.max_bytes(g.max_bytes))
            )),
        };
        match case {
            Case::Nccl => nccl(),
            Case::Custom(f) => custom(f, self.plan.ctas(self.nranks, f), case.name().into()),
            Case::Grid(f, ctas) => match &self.group {
                Err(e) => Err(e.clone()),
                Ok(g) => {
                    let c = grid_ctas(ctas, g.max_blocks)?;
                    custom(f, Some(c), grid_name(f, c))
                }
            },
            Case::Auto => match ear::choose(Requested::Auto, &call, self.capability()).path {
                Path::Custom(f) => Ok((Launch::Custom(f, None), Case::Custom(f).name().into())),
                _ => nccl().map_err(|e| format!("AUTO picks NCCL here, and {e}")),
            },
            Case::Plugin => {
                if !self.registered {
                    return Err(match &self.comms {
                        Err(e) => format!("the plugin runs on registered NCCL communicators, and {e}"),
                        Ok(_) => "registering the communicators with the plugin library failed".into(),
                    });
                }
                // The plugin's own decision, as its enqueue will make it on device `devices[0]`.
                let config = PluginConfig::with_tp_size(self.nranks).map_err(|e| e.to_string())?;
                let group = ear::group_for(self.devices[0]);
                let cap = group.as_ref().map(|(g, _)| &**g as &dyn Fits);
                Ok((Launch::Plugin, path_name(ear::choose(ear::requested(&config), &call, cap).path).into()))
            }
            _ => Err("a fused row".into()),
        }
    }

    /// What a fused row runs at this shape (and the path it takes), or why it cannot run.
    fn plan_fused(&self, case: Case, dtype: DataType, shape: &Shape) -> Result<(FusedOp, &'static str), String> {
        let call = fused_call(self.nranks, dtype, shape);
        let nccl_norm = |why: &str| match &self.comms {
            Ok(_) => Ok((FusedOp::NcclThenNorm, "nccl")),
            Err(e) => Err(format!("{why}{e}")),
        };
        let op = |op: FusedOp| Ok((op, fused::path_of(op)));
        match case {
            Case::Fused(f) => match &self.group {
                Err(e) => Err(e.clone()),
                Ok(g) if g.serves(f, dtype, &call.message) => op(FusedOp::Fused(f)),
                Ok(g) => Err(format!(
                    "{} does not take {} rows of {} with this workspace ({})",
                    case.name(),
                    shape.tokens,
                    shape.hidden,
                    fmt_bytes(f.max_bytes(g.max_bytes))
                )),
            },
            Case::FusedAuto => match ear::choose(Requested::Auto, &call, self.capability()).path {
                Path::Custom(f) => op(FusedOp::Fused(f)),
                Path::Split(f) => op(FusedOp::ArThenNorm(f)),
                _ => nccl_norm("AUTO picks NCCL then the norm kernel here, and "),
            },
            Case::ArThenNorm => match ear::choose(
                Requested::Auto,
                &plain_call(self.nranks, dtype, call.message.bytes),
                self.capability(),
            )
            .path
            {
                Path::Custom(f) => op(FusedOp::ArThenNorm(f)),
                _ => {
                    Err("AUTO picks NCCL for the plain all-reduce of this size (that is the nccl_then_norm row)".into())
                }
            },
            Case::NcclThenNorm => nccl_norm(""),
            Case::Split(f) => match &self.group {
                Err(e) => Err(e.clone()),
                Ok(g) if g.serves_bytes(f, dtype, call.message.bytes) => op(FusedOp::ArThenNorm(f)),
                Ok(g) => Err(format!(
                    "{} serves up to {} with this workspace",
                    Case::Custom(f).name(),
                    fmt_bytes(f.max_bytes(g.max_bytes))
                )),
            },
            Case::PluginFused => {
                if !self.registered {
                    return Err(match &self.comms {
                        Err(e) => format!("the plugin runs on registered NCCL communicators, and {e}"),
                        Ok(_) => "registering the communicators with the plugin library failed".into(),
                    });
                }
                // The fused plugin's own decision, as its enqueue will make it on `devices[0]`.
                let config = fused_config(self.nranks, shape.bias).map_err(|e| e.to_string())?;
                let group = ear::group_for(self.devices[0]);
                let cap = group.as_ref().map(|(g, _)| &**g as &dyn Fits);
                Ok((FusedOp::Plugin, path_name(ear::choose(ear::requested(&config), &call, cap).path)))
            }
            _ => Err("not a fused row".into()),
        }
    }
}

/// A fused plugin's configuration: AUTO, fusion_op RESIDUAL_RMS_NORM, default eps.
fn fused_config(tp_size: i32, has_bias: bool) -> edgellm_allreduce::Result<PluginConfig> {
    let mut c = PluginConfig::with_tp_size(tp_size)?;
    c.fusion_op = FusionOp::ResidualRmsNorm;
    c.has_bias = has_bias;
    Ok(c)
}

/// One rank's thread: its device, stream, buffers.
struct Worker<'a> {
    shared: &'a Shared<'a>,
    rank: usize,
    stream: Arc<CudaStream>,
    input: DevBuf,
    output: DevBuf,
    core: PluginCore,
    /// The fused sweep's tensors, kernels and plugins; None when it does not run.
    fused: Option<WorkerFused>,
}

struct WorkerFused {
    bufs: FusedBufs,
    kernels: Arc<DeviceKernels>,
    /// Fused plugins without and with a bias input.
    cores: [PluginCore; 2],
}

struct RealRun<'a> {
    w: &'a Worker<'a>,
    launch: Launch,
    dtype: DataType,
    count: usize,
    reference: &'a [f64],
}

impl Runner for RealRun<'_> {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.w.stream
    }
    fn poison(&self) -> Res<()> {
        memset_async(self.w.output.ptr, data::POISON, self.count * self.dtype.size(), &self.w.stream)
    }
    fn enqueue(&self) -> Res<()> {
        let (w, sh) = (self.w, self.w.shared);
        let (input, output, stream) = (w.input.ptr, w.output.ptr, w.stream.cu_stream() as usize);
        match self.launch {
            // SAFETY: buffers of `count` elements on this rank's device, its stream; every rank
            // enqueues the same call.
            Launch::Nccl => unsafe {
                let comm = sh.comms.as_ref().expect("planned with NCCL")[w.rank];
                sh.nccl.expect("planned with NCCL").all_reduce(input, output, self.count, self.dtype, comm, stream)
            },
            Launch::Custom(f, ctas) => unsafe {
                let group = sh.group.as_ref().expect("planned with a group");
                let (rank, dtype, count) = (w.rank as i32, self.dtype, self.count);
                let (input, output, stream) = (DevicePtr(input), DevicePtr(output), Stream(stream));
                match ctas {
                    Some(c) => group.launch_with_ctas(rank, f, dtype, input, output, count, stream, c),
                    None => group.launch(rank, f, dtype, input, output, count, stream),
                }
                .map_err(|e| e.to_string())
            },
            Launch::Plugin => {
                let mut dims = [0i64; 8];
                dims[0] = self.count as i64;
                let desc = TensorDesc { nb_dims: 1, dims, dtype: trt_code(self.dtype), format: 0 };
                w.core
                    .enqueue(&[desc], &[desc], &[input as usize], &[output as usize], stream)
                    .map_err(|e| format!("PluginCore::enqueue: {e}"))
            }
        }
    }
    fn check(&self) -> Res<Vec<OutputCheck>> {
        let out = self.w.output.download(self.count * self.dtype.size())?;
        Ok(vec![data::check_output(&out, self.reference, self.dtype)])
    }
}

/// One fused row on one rank.
struct RealFusedRun<'a> {
    w: &'a Worker<'a>,
    f: &'a WorkerFused,
    op: FusedOp,
    /// The plain all-reduce's grid of a split op (`Plan::ctas`).
    ctas: Option<u32>,
    dtype: DataType,
    shape: Shape,
    eps: f32,
    reference: &'a (Vec<f64>, Vec<f64>),
}

impl Runner for RealFusedRun<'_> {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.w.stream
    }
    fn poison(&self) -> Res<()> {
        self.f.bufs.poison(self.shape.bytes(self.dtype) as usize, &self.w.stream)
    }
    fn enqueue(&self) -> Res<()> {
        let (w, sh, f) = (self.w, self.w.shared, self.f);
        let stream = w.stream.cu_stream() as usize;
        let (shape, dtype, count) = (&self.shape, self.dtype, self.shape.count());
        match self.op {
            // SAFETY: the buffers hold the shape on this rank's device (fresh allocations:
            // aligned), its stream; every rank enqueues the same call.
            FusedOp::Fused(_) | FusedOp::ArThenNorm(_) => unsafe {
                let group = sh.group.as_ref().expect("planned with a group");
                let (op, ctas) = (self.op, self.ctas);
                fused::enqueue_custom(group, w.rank, op, dtype, &f.bufs, shape, self.eps, &f.kernels, stream, ctas)
            },
            // SAFETY: as above; the norm reads the reduced x from normed and overwrites it in
            // place, as the plugin's NCCL path does.
            FusedOp::NcclThenNorm => unsafe {
                let comm = sh.comms.as_ref().expect("planned with NCCL")[w.rank];
                let call = f.bufs.call(shape, self.eps);
                sh.nccl.expect("planned with NCCL").all_reduce(
                    f.bufs.x.ptr,
                    f.bufs.normed.ptr,
                    count,
                    dtype,
                    comm,
                    stream,
                )?;
                call.launch_norm(&f.kernels, dtype, call.normed, Stream(stream))
                    .map_err(|e| format!("launch_norm: {e}"))
            },
            FusedOp::Plugin => {
                let code = trt_code(dtype);
                let mut xd = [0i64; 8];
                (xd[0], xd[1]) = (shape.tokens as i64, shape.hidden as i64);
                let mut wd = [0i64; 8];
                wd[0] = shape.hidden as i64;
                let x = TensorDesc { nb_dims: 2, dims: xd, dtype: code, format: 0 };
                let row = TensorDesc { nb_dims: 1, dims: wd, dtype: code, format: 0 };
                let b = &f.bufs;
                let mut inputs = vec![x, x, row];
                let mut ptrs = vec![b.x.ptr as usize, b.residual.ptr as usize, b.gamma.ptr as usize];
                if shape.bias {
                    inputs.push(row);
                    ptrs.push(b.bias.ptr as usize);
                }
                let core = &f.cores[shape.bias as usize];
                core.enqueue(&inputs, &[x, x], &ptrs, &[b.normed.ptr as usize, b.residual_out.ptr as usize], stream)
                    .map_err(|e| format!("PluginCore::enqueue (fused): {e}"))
            }
        }
    }
    fn check(&self) -> Res<Vec<OutputCheck>> {
        let out = self.f.bufs.download(self.shape.bytes(self.dtype) as usize)?;
        Ok(data::check_fused(&out.0, &out.1, self.reference, self.dtype).to_vec())
    }
}

/// The fused sweep on one rank's thread: per (dtype, shape) fresh inputs and the fp64
/// references (rank 0 computes them once every rank has added its x), then every fused row.
fn fused_sweep(
    shared: &Shared,
    w: &Worker,
    f: &WorkerFused,
    team: &Member,
    timer: &Timer,
    gated: Option<Gated>,
) -> Result<(), Fatal> {
    let (plan, rank, n) = (shared.plan, w.rank, shared.nranks);
    let s = &plan.settings;
    let eps = fused::eps();
    let message = |m: String| {
        if rank == 0 {
            shared.sink.lock().unwrap().message(m);
        }
    };
    for &dtype in &plan.dtypes {
        for shape in &plan.shapes {
            let (count, bytes) = (shape.count(), shape.bytes(dtype));
            let label = format!("real {n} ranks {} {}", dtype_name(dtype), shape.label());
            message(format!("{label}: data"));
            if rank == 0 {
                shared.sink.lock().unwrap().step(label.clone());
                *shared.reference.write().unwrap() = vec![0f64; count];
            }
            team.barrier();
            let x = data::generate(count, dtype, data::seed(n, bytes, rank), None);
            data::accumulate(&x, dtype, &mut shared.reference.write().unwrap());
            let inputs = data::shared_inputs(n, dtype, shape.tokens, shape.hidden, shape.bias);
            let uploaded = f.bufs.upload(&x, &inputs);
            drop(x);
            // Also the point after which every rank's x is in the sum.
            let failed: Vec<Option<String>> = team.gather(uploaded.err());
            if let Some((r, e)) = failed.into_iter().enumerate().find_map(|(r, e)| e.map(|e| (r, e))) {
                return Err(Fatal(format!("rank {r}: uploading the fused inputs: {e}")));
            }
            if rank == 0 {
                let reference = data::fused_reference(&shared.reference.read().unwrap(), &inputs, shape.hidden, eps);
                *shared.fused_reference.write().unwrap() = reference;
            }
            team.barrier();
            let reference = shared.fused_reference.read().unwrap();
            for &case in &plan.fused_cases {
                let mut r = Record::new("real", n, dtype_name(dtype), bytes, case.name(), &shared.label);
                r.shape = shape.label();
                match shared.plan_fused(case, dtype, shape) {
                    Err(why) => {
                        if rank == 0 {
                            r.note = why;
                            shared.sink.lock().unwrap().push(r, true);
                        }
                    }
                    Ok((op, path)) => {
                        message(format!("{label} {}", case.name()));
                        let ctas = match op {
                            FusedOp::ArThenNorm(family) => plan.ctas(n, family),
                            _ => None,
                        };
                        let runner = RealFusedRun { w, f, op, ctas, dtype, shape: *shape, eps, reference: &reference };
                        let m = measure::measure(&runner, team, timer, s, gated)?;
                        if rank == 0 {
                            r.path = path.into();
                            m.fill(&mut r, s, None);
                            shared.sink.lock().unwrap().push(r, true);
                        }
                    }
                }
            }
            drop(reference);
        }
    }
    Ok(())
}

fn worker(shared: &Shared, rank: usize) -> Result<(), Fatal> {
    let team = Member { meeting: &shared.meeting, rank };
    let plan = shared.plan;
    let s = &plan.settings;
    let ctx = &shared.ctxs[rank];
    let buf_bytes = plan.sizes.iter().max().map_or(1, |&b| b as usize);
    let setup = (|| -> Res<(Worker, Timer)> {
        ctx.bind_to_thread().ctx("binding the context")?;
        let core = PluginCore::new(PluginConfig::with_tp_size(shared.nranks).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let fused = if plan.fused_cases.is_empty() {
            None
        } else {
            let max_elem = plan.dtypes.iter().map(|d| d.size()).max().unwrap_or(2);
            let max_bytes = plan.shapes.iter().map(|sh| sh.count() * max_elem).max().unwrap_or(16);
            let max_row = plan.shapes.iter().map(|sh| sh.hidden as usize * max_elem).max().unwrap_or(16);
            let plugin = |bias| {
                fused_config(shared.nranks, bias).and_then(PluginCore::new).map_err(|e| format!("fused plugin: {e}"))
            };
            Some(WorkerFused {
                bufs: FusedBufs::new(ctx, max_bytes, max_row)?,
                kernels: edgellm_allreduce::device_kernels(shared.devices[rank])
                    .map_err(|e| format!("loading the kernels: {e}"))?,
                cores: [plugin(false)?, plugin(true)?],
            })
        };
        let w = Worker {
            shared,
            rank,
            stream: ctx.new_stream().ctx("cuStreamCreate")?,
            input: DevBuf::new(ctx, buf_bytes)?,
            output: DevBuf::new(ctx, buf_bytes)?,
            core,
            fused,
        };
        Ok((w, Timer::new(ctx)?))
    })();
    let failed: Vec<Option<String>> = team.gather(setup.as_ref().err().cloned());
    if let Some((r, e)) = failed.into_iter().enumerate().find_map(|(r, e)| e.map(|e| (r, e))) {
        return Err(Fatal(format!("setting up rank {r} (device {}): {e}", shared.devices[r])));
    }
    let (w, timer) = setup.expect("checked");
    // Every device must be able to wait on the gate, or no device uses it.
    let probed = shared.gate.as_ref().map(|g| g.probe(&w.stream));
    let all: Vec<Option<Res<u64>>> = team.gather(probed.clone());
    let gated = match (&shared.gate, probed) {
        (Some(gate), Some(Ok(device_ptr))) if all.iter().all(|p| matches!(p, Some(Ok(_)))) => {
            Some(Gated { gate, device_ptr })
        }
        _ => {
            if rank == 0 {
                let why = all
                    .iter()
                    .find_map(|p| p.as_ref().and_then(|r| r.as_ref().err().cloned()))
                    .unwrap_or_else(|| "no gate".into());
                shared
                    .sink
                    .lock()
                    .unwrap()
                    .say(format!("warning: no start gate ({why}): batches start from a spinning barrier"));
            }
            None
        }
    };
    let message = |m: String| {
        if rank == 0 {
            shared.sink.lock().unwrap().message(m);
        }
    };

    for &dtype in &plan.dtypes {
        for &bytes in &plan.sizes {
            let count = bytes as usize / dtype.size();
            let label = format!("real {} ranks {} {}", shared.nranks, dtype_name(dtype), fmt_bytes(bytes));
            message(format!("{label}: data"));
            if rank == 0 {
                shared.sink.lock().unwrap().step(label.clone());
            }
            if rank == 0 {
                *shared.reference.write().unwrap() = vec![0f64; count];
            }
            team.barrier();
            let mine = data::generate(count, dtype, data::seed(shared.nranks, bytes, rank), None);
            {
                let mut reference = shared.reference.write().unwrap();
                data::accumulate(&mine, dtype, &mut reference);
            }
            let uploaded = w.input.upload(&mine);
            drop(mine);
            let failed: Vec<Option<String>> = team.gather(uploaded.err());
            if let Some((r, e)) = failed.into_iter().enumerate().find_map(|(r, e)| e.map(|e| (r, e))) {
                return Err(Fatal(format!("rank {r}: uploading the input: {e}")));
            }
            let reference = shared.reference.read().unwrap();
            for &case in &plan.cases {
                let mut r = Record::new("real", shared.nranks, dtype_name(dtype), bytes, case.name(), &shared.label);
                match shared.plan(case, dtype, bytes) {
                    Err(why) => {
                        if rank == 0 {
                            r.note = why;
                            shared.sink.lock().unwrap().push(r, true);
                        }
                    }
                    Ok((launch, path)) => {
                        message(format!("{label} {}", case.name()));
                        let runner = RealRun { w: &w, launch, dtype, count, reference: &reference };
                        let m = measure::measure(&runner, &team, &timer, s, gated)?;
                        if rank == 0 {
                            r.path = path;
                            m.fill(&mut r, s, None);
                            shared.sink.lock().unwrap().push(r, true);
                        }
                    }
                }
            }
            drop(reference);
        }
    }
    if let Some(f) = &w.fused {
        fused_sweep(shared, &w, f, &team, &timer, gated)?;
    }

    // Teardown: the plugin's registrations first (its group goes), then the communicators,
    // each destroyed by its own device's thread.
    if let Err(e) = w.stream.synchronize() {
        shared.sink.lock().unwrap().say(format!("warning: rank {rank}: synchronize: {e:?}"));
    }
    team.barrier();
    if rank == 0 && shared.registered {
        if let Ok(comms) = &shared.comms {
            for (d, c) in shared.devices.iter().zip(comms) {
                // SAFETY: the communicator registered above; it is only compared.
                unsafe { abi::edgellmUnregisterNcclCommForAllReducePlugin(*d, *c as *mut c_void) };
            }
        }
    }
    team.barrier();
    if let (Ok(comms), Some(nccl)) = (&shared.comms, shared.nccl) {
        if let Err(e) = nccl.destroy(comms[rank]) {
            shared.sink.lock().unwrap().say(format!("warning: rank {rank}: {e}"));
        }
    }
    team.barrier();
    Ok(())
}

pub fn run(plan: &Plan, nccl: Option<&Nccl>, nccl_note: &str, sink: &Mutex<Sink>) -> Result<(), Fatal> {
    let available = gpu::device_count();
    let say = |m: String| sink.lock().unwrap().say(m);
    for &n in &plan.ranks {
        if n < 2 || n > available {
            let e = format!("real mode with {n} ranks needs {n} GPUs (2 or more); this machine has {available}");
            let mut sink = sink.lock().unwrap();
            sink.say(format!("skipped: {e}"));
            for (dtype, bytes, case, shape) in plan.rows(false).into_iter().chain(plan.rows(true)) {
                let mut r = Record::new("real", n, dtype_name(dtype), bytes, case.name(), "");
                (r.status, r.note, r.shape) = (Status::NotApplicable, e.clone(), shape);
                sink.push(r, true);
            }
            continue;
        }
        let devices: Vec<i32> = (0..n).collect();
        sink.lock().unwrap().message(format!("real {n} ranks: setting up"));
        let ctxs = devices.iter().map(|&d| gpu::context(d as usize)).collect::<Res<Vec<_>>>().map_err(Fatal)?;
        // Rounded as the library rounds EDGELLM_ALLREDUCE_WORKSPACE_BYTES (which main sets too,
        // so the plugin's group gets the same workspace).
        let ws = plan.workspace_bytes.map_or_else(|| ear::max_message_bytes(n), |b| b.div_ceil(16) * 16);
        let group = Group::in_process(&devices, ws).map_err(|e| format!("no custom group: {e}"));
        // No communicators where no row can use them (tune's grid sweep): ncclCommInitAll
        // costs seconds per rank count.
        let uses_nccl = plan.cases.iter().chain(&plan.fused_cases).any(|c| {
            matches!(
                c,
                Case::Nccl | Case::Auto | Case::Plugin | Case::FusedAuto | Case::NcclThenNorm | Case::PluginFused
            )
        });
        let comms = match nccl {
            Some(_) if !uses_nccl => Err("no row uses NCCL".to_owned()),
            Some(nccl) => nccl.init_all(&devices),
            None => Err(format!("no NCCL ({nccl_note})")),
        };
        // What a runtime does after ncclCommInitAll: one registration per device; the plugin
        // library forms its own custom group when the last rank is registered.
        let mut registered = false;
        if let (Ok(comms), Some(nccl)) = (&comms, nccl) {
            let ok: Vec<bool> = devices
                .iter()
                .zip(comms)
                .map(|(&d, &c)| {
                    // SAFETY: a live communicator of device d and the ncclAllReduce of the NCCL
                    // that made it, unregistered before they go.
                    unsafe {
                        abi::edgellmRegisterNcclCommForAllReducePlugin(
                            d,
                            c as *mut c_void,
                            nccl.all_reduce_address() as *mut c_void,
                        )
                    }
                })
                .collect();
            registered = ok.iter().all(|&x| x);
            if !registered {
                for ((&d, &c), _) in devices.iter().zip(comms).zip(&ok).filter(|(_, &k)| k) {
                    // SAFETY: only compared.
                    unsafe { abi::edgellmUnregisterNcclCommForAllReducePlugin(d, c as *mut c_void) };
                }
            }
        }
        let plugin_ranks = if registered { abi::edgellmAllReduceCustomRanks(devices[0]) } else { 0 };
        let names: Vec<String> = ctxs.iter().map(|c| gpu::device_name(c)).collect();
        let label =
            if names.iter().all(|x| x == &names[0]) { format!("{n}× {}", names[0]) } else { names.join(" + ") };
        say(format!(
            "real {n} ranks on GPUs {devices:?} ({label}): custom group {}; NCCL {}; plugin {}",
            match &group {
                Ok(g) => format!("ready (grid ≤ {} CTAs, messages up to {})", g.max_blocks, fmt_bytes(g.max_bytes)),
                Err(e) => e.clone(),
            },
            match (&comms, nccl) {
                (Ok(_), Some(l)) => format!("{} ({})", l.version_string(), l.path),
                (Err(e), _) => e.clone(),
                _ => String::new(),
            },
            if !registered {
                "not registered (no NCCL)".to_string()
            } else if plugin_ranks == n {
                format!("registered, its custom group formed ({n} ranks)")
            } else {
                "registered, but no custom group formed: the plugin runs NCCL".to_string()
            }
        ));
        // Pinned, portable: every device's stream waits on the same word.
        let gate = if !plan.settings.profiler {
            Gate::new().map_err(|e| say(format!("warning: no start gate: {e}"))).ok()
        } else {
            None
        };
        let shared = Shared {
            gate,
            plan,
            nranks: n,
            devices: devices.clone(),
            ctxs,
            meeting: Meeting::new(n as usize),
            reference: RwLock::new(Vec::new()),
            fused_reference: RwLock::new((Vec::new(), Vec::new())),
            group,
            nccl,
            comms,
            registered,
            sink,
            label,
        };
        let results: Vec<Result<(), Fatal>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n as usize)
                .map(|rank| {
                    scope.spawn({
                        let shared = &shared;
                        move || worker(shared, rank)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Fatal("a rank's thread panicked".into()))))
                .collect()
        });
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
            return Err(e);
        }
    }
    Ok(())
}
