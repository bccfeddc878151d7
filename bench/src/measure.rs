//! The timing method, shared by both modes.
//!
//! A row is measured by one thread per device (real mode) or by one thread driving N simulated
//! ranks (sim): each runs [`measure`] with its [`Runner`], and the threads meet through a
//! [`Team`] at every point where they must agree. Steps:
//! 1. check: outputs poisoned, one all-reduce, every rank's output bit-identical and within
//!    tolerance of the fp64 sum (a failure skips the timing);
//! 2. capture ONE all-reduce into a CUDA graph (per thread: one graph per device in real mode);
//! 3. graph timing: `warmup + batches` batches; each batch starts on every device together
//!    (barrier), replays the graph `replays` times back to back between two events; per-call
//!    time = elapsed / replays; a batch's time is its slowest device's; median, p10, p90 over
//!    the timed batches;
//! 4. eager timing: the same with direct launches (host launch cost included);
//! 5. check again after the replays (outputs poisoned, one replay).
//!
//! A launch that fails on one rank while its peers' kernels spin cannot be recovered: every
//! thread learns it at the next agreement point (before it waits on the GPU) and the run stops.

use crate::data::{self, OutputCheck};
use crate::gpu::{capture, watchdog, Res, Timer};
use crate::record::{Record, Status};
use crate::stats;
use cudarc::driver::CudaStream;
use edgellm_allreduce::tensor::DataType;
use std::any::Any;
use std::sync::{Arc, Barrier, Mutex};

#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub replays: u32,
    pub batches: u32,
    pub warmup: u32,
    pub eager: bool,
}

/// What one thread does for one row.
pub trait Runner {
    /// Where the events go: the thread's stream (sim: the origin stream all ranks join).
    fn stream(&self) -> &Arc<CudaStream>;
    /// Fills this thread's outputs with [`data::POISON`], in stream order.
    fn poison(&self) -> Res<()>;
    /// Enqueues this thread's part of one all-reduce.
    fn enqueue(&self) -> Res<()>;
    /// After the stream is synchronized: this thread's outputs against the reference.
    fn check(&self) -> Res<Vec<OutputCheck>>;
}

/// The threads that measure a row together.
pub trait Team {
    fn barrier(&self);
    /// Every thread's value, in rank order.
    fn gather<T: Clone + Send + 'static>(&self, v: T) -> Vec<T>;
}

/// One thread (simulation).
pub struct Solo;
impl Team for Solo {
    fn barrier(&self) {}
    fn gather<T: Clone + Send + 'static>(&self, v: T) -> Vec<T> {
        vec![v]
    }
}

/// What the threads of a real-mode team share.
pub struct Meeting {
    barrier: Barrier,
    slots: Mutex<Vec<Option<Box<dyn Any + Send>>>>,
}
impl Meeting {
    pub fn new(n: usize) -> Self {
        Meeting { barrier: Barrier::new(n), slots: Mutex::new((0..n).map(|_| None).collect()) }
    }
}

/// One thread's membership of a [`Meeting`].
pub struct Member<'a> {
    pub meeting: &'a Meeting,
    pub rank: usize,
}
impl Team for Member<'_> {
    fn barrier(&self) {
        self.meeting.barrier.wait();
    }
    fn gather<T: Clone + Send + 'static>(&self, v: T) -> Vec<T> {
        self.meeting.slots.lock().unwrap()[self.rank] = Some(Box::new(v));
        self.meeting.barrier.wait();
        let all = self.meeting.slots.lock().unwrap().iter().map(|s| s.as_ref().and_then(|b| b.downcast_ref::<T>()).cloned().expect("every rank posted")).collect();
        // Nobody posts the next value before everyone has read this one.
        self.meeting.barrier.wait();
        all
    }
}

/// A fatal error: the run cannot go on (a peer may be spinning on the GPU).
#[derive(Debug)]
pub struct Fatal(pub String);

/// What a measurement found; `None` times where the step did not run.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub status: Option<Status>,
    pub graph: Option<stats::Summary>,
    pub eager: Option<f64>,
    pub note: String,
}

impl Measured {
    pub fn fill(&self, r: &mut Record, settings: &Settings, roof_gbps: Option<f64>) {
        r.status = self.status.unwrap_or(Status::Error);
        if let Some(g) = self.graph {
            r.median_us = Some(g.median);
            r.p10_us = Some(g.p10);
            r.p90_us = Some(g.p90);
        }
        r.eager_us = self.eager;
        r.replays = settings.replays;
        r.batches = settings.batches;
        r.note = self.note.clone();
        r.derive_bandwidths(roof_gbps);
    }
}

/// Launches `launch` (one all-reduce, or one graph replay) on every thread after poisoning the
/// outputs, and checks the outputs. Err: fatal; Ok(Err): the check failed.
fn checked(runner: &impl Runner, team: &impl Team, dtype: DataType, launch: &dyn Fn() -> Res<()>) -> Result<Result<f64, String>, Fatal> {
    let enqueued = runner.poison().and_then(|_| launch());
    agree(team, &enqueued)?;
    let local = runner.stream().synchronize().map_err(|e| format!("synchronize: {e:?}")).and_then(|_| runner.check());
    let all: Vec<Result<Vec<OutputCheck>, String>> = team.gather(local);
    let mut checks = Vec::new();
    for (rank, r) in all.into_iter().enumerate() {
        match r {
            Ok(c) => checks.extend(c),
            Err(e) => return Err(Fatal(format!("rank {rank}: {e}"))),
        }
    }
    watchdog::tick();
    Ok(data::verdict(&checks, dtype))
}

/// Every thread learns whether all enqueued; a failure anywhere is fatal.
fn agree(team: &impl Team, r: &Res<()>) -> Result<(), Fatal> {
    let errors: Vec<Option<String>> = team.gather(r.as_ref().err().cloned());
    match errors.into_iter().enumerate().find_map(|(rank, e)| e.map(|e| (rank, e))) {
        Some((rank, e)) => Err(Fatal(format!("rank {rank}: {e}"))),
        None => Ok(()),
    }
}

/// Times `warmup + batches` batches of `replays` calls of `launch`; the slowest thread's
/// per-call time of each timed batch (µs).
fn batches(runner: &impl Runner, team: &impl Team, timer: &Timer, s: &Settings, launch: &dyn Fn() -> Res<()>) -> Result<Vec<f64>, Fatal> {
    let stream = runner.stream();
    let mut mine = Vec::new();
    for b in 0..s.warmup + s.batches {
        team.barrier();
        let (start, stop) = timer.events();
        let enqueued = start
            .record(stream)
            .map_err(|e| format!("cuEventRecord: {e:?}"))
            .and_then(|_| (0..s.replays).try_for_each(|_| launch()))
            .and_then(|_| stop.record(stream).map_err(|e| format!("cuEventRecord: {e:?}")));
        agree(team, &enqueued)?;
        let us = timer.wait_per_call_us(s.replays).map_err(Fatal)?;
        if b >= s.warmup {
            mine.push(us);
        }
        watchdog::tick();
    }
    Ok(stats::slowest_per_batch(&team.gather(mine)))
}

/// Measures one row (see the module documentation). Every thread of the team calls it with the
/// same settings; all get the same result.
pub fn measure(runner: &impl Runner, team: &impl Team, timer: &Timer, s: &Settings, dtype: DataType) -> Result<Measured, Fatal> {
    let mut m = Measured::default();
    let eager = || runner.enqueue();
    if let Err(e) = checked(runner, team, dtype, &eager)? {
        m.status = Some(Status::Failed);
        m.note = format!("check before timing: {e}");
        return Ok(m);
    }
    let graph = capture(runner.stream(), || runner.enqueue());
    let captured: Vec<Option<String>> = team.gather(graph.as_ref().err().cloned());
    if let Some((rank, e)) = captured.into_iter().enumerate().find_map(|(r, e)| e.map(|e| (r, e))) {
        m.status = Some(Status::Error);
        m.note = format!("graph capture on rank {rank}: {e}");
        return Ok(m);
    }
    let graph = graph.expect("every rank captured");
    let replay = || graph.launch().map_err(|e| format!("cuGraphLaunch: {e:?}"));
    m.graph = Some(stats::summarize(&batches(runner, team, timer, s, &replay)?));
    if s.eager {
        m.eager = Some(stats::summarize(&batches(runner, team, timer, s, &eager)?).median);
    }
    match checked(runner, team, dtype, &replay)? {
        Ok(_) => m.status = Some(Status::Ok),
        Err(e) => {
            m.status = Some(Status::Failed);
            m.note = format!("check after {} graph replays: {e}", (s.warmup + s.batches) * s.replays);
        }
    }
    Ok(m)
}

/// Where records go: the CSV (as they come), the list for the table and plot, the progress bar.
pub struct Sink {
    pub records: Vec<Record>,
    csv: Option<crate::record::CsvWriter>,
    pub bar: indicatif::ProgressBar,
}

impl Sink {
    pub fn new(csv: Option<crate::record::CsvWriter>, total: u64) -> Self {
        let bar = indicatif::ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Sink { records: Vec::new(), csv, bar }
    }

    /// A row result; `counts` says whether it is one of the sweep's cases (floor and copy rows
    /// are extra).
    pub fn push(&mut self, r: Record, counts: bool) {
        if let Some(w) = self.csv.as_mut() {
            if let Err(e) = w.write(&r) {
                self.bar.println(format!("warning: writing the CSV: {e}"));
                self.csv = None;
            }
        }
        if matches!(r.status, Status::Failed | Status::Error) {
            self.bar.println(format!(
                "{} {} ranks {} {} {}: {} {}",
                r.mode,
                r.ranks,
                r.dtype,
                crate::stats::fmt_bytes(r.bytes),
                r.strategy,
                r.status.name(),
                r.note
            ));
        }
        self.records.push(r);
        if counts {
            self.bar.inc(1);
        }
    }

    pub fn message(&self, m: String) {
        watchdog::at(m.clone());
        self.bar.set_message(m);
    }
}
