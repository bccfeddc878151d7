//! The timing method, shared by both modes.
//!
//! A row is measured by one thread per device (real mode) or by one thread driving N simulated
//! ranks (sim): each runs [`measure`] with its [`Runner`], and the threads meet through a
//! [`Team`] at every point where they must agree. Steps:
//! 1. check: outputs poisoned, one all-reduce (or fused op), every rank's output(s)
//!    bit-identical and within tolerance of the fp64 reference (a failure skips the timing);
//! 2. capture `graph_ops` (default 1) all-reduces, back to back, into a CUDA graph (per thread:
//!    one graph per device in real mode); times are per all-reduce;
//! 3. graph timing: `warmup + batches` batches; each batch is enqueued on every device behind
//!    a closed [`Gate`] (start event, the graph replayed `replays` times back to back, stop
//!    event), then the gate opens for all devices at once; per-call time = elapsed / replays;
//!    a batch's time is its slowest device's; median, p10, p90 over the timed batches;
//! 4. eager timing: the same with direct launches, ungated (the batch starts on every thread
//!    from a spinning barrier), so the host's launch cost is included;
//! 5. check again after the replays (outputs poisoned, one replay).
//!
//! A launch that fails on one rank while its peers' kernels spin cannot be recovered: every
//! thread learns it at the next agreement point (before it waits on the GPU) and the run stops.

use crate::gpu::{capture, watchdog, Gate, Res, Timer, GATE_MAX_CALLS};
use crate::record::{Record, Status};
use crate::stats;
use cudarc::driver::CudaStream;
use edgellm_test_support::{self as data, OutputCheck};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub replays: u32,
    /// Ops captured back to back in each graph; times are per op.
    pub graph_ops: u32,
    pub batches: u32,
    pub warmup: u32,
    pub eager: bool,
    /// Under a profiler that serializes kernel launches (Nsight Compute with `--graph-profiling
    /// graph`): no start gate and no eager launch, which would wait for ever behind it or leave
    /// one rank's kernel waiting alone for its peers; the check before timing replays a one-op
    /// graph instead.
    pub profiler: bool,
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
    fn rank(&self) -> usize;
    fn barrier(&self);
    /// Every thread's value, in rank order.
    fn gather<T: Clone + Send + 'static>(&self, v: T) -> Vec<T>;
}

/// One thread (simulation).
pub struct Solo;
impl Team for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn barrier(&self) {}
    fn gather<T: Clone + Send + 'static>(&self, v: T) -> Vec<T> {
        vec![v]
    }
}

/// A barrier whose waiters spin (then yield): every thread leaves within about a microsecond
/// of the last arrival, where a sleeping barrier's wake-ups spread over tens of µs. A batch's
/// start skew between devices ends up in the slowest device's time (divided by the replays).
pub struct SpinBarrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}
impl SpinBarrier {
    pub fn new(n: usize) -> Self {
        SpinBarrier { n, arrived: AtomicUsize::new(0), generation: AtomicUsize::new(0) }
    }
    pub fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            // Reset before releasing: nobody arrives for the next round before the release.
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if spins < 1 << 16 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// What the threads of a real-mode team share.
pub struct Meeting {
    barrier: SpinBarrier,
    slots: Mutex<Vec<Option<Box<dyn Any + Send>>>>,
}
impl Meeting {
    pub fn new(n: usize) -> Self {
        Meeting { barrier: SpinBarrier::new(n), slots: Mutex::new((0..n).map(|_| None).collect()) }
    }
}

/// One thread's membership of a [`Meeting`].
pub struct Member<'a> {
    pub meeting: &'a Meeting,
    pub rank: usize,
}
impl Team for Member<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn barrier(&self) {
        self.meeting.barrier.wait();
    }
    fn gather<T: Clone + Send + 'static>(&self, v: T) -> Vec<T> {
        self.meeting.slots.lock().unwrap()[self.rank] = Some(Box::new(v));
        self.meeting.barrier.wait();
        let all = self
            .meeting
            .slots
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.as_ref().and_then(|b| b.downcast_ref::<T>()).cloned().expect("every rank posted"))
            .collect();
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
        r.graph_ops = settings.graph_ops;
        r.note = self.note.clone();
        r.derive_bandwidths(roof_gbps);
    }
}

/// Launches `launch` (one all-reduce, or one graph replay) on every thread after poisoning the
/// outputs, and checks the outputs. Err: fatal; Ok(Err): the check failed.
fn checked(runner: &impl Runner, team: &impl Team, launch: &dyn Fn() -> Res<()>) -> Result<Result<f64, String>, Fatal> {
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
    Ok(data::verdict(&checks))
}

/// Every thread learns whether all enqueued; a failure anywhere is fatal.
fn agree(team: &impl Team, r: &Res<()>) -> Result<(), Fatal> {
    let errors: Vec<Option<String>> = team.gather(r.as_ref().err().cloned());
    match errors.into_iter().enumerate().find_map(|(rank, e)| e.map(|e| (rank, e))) {
        Some((rank, e)) => Err(Fatal(format!("rank {rank}: {e}"))),
        None => Ok(()),
    }
}

/// This thread's view of the start gate: the gate and its address in this thread's context.
#[derive(Clone, Copy)]
pub struct Gated<'a> {
    pub gate: &'a Gate,
    pub device_ptr: u64,
}

/// Times `warmup + batches` batches of `replays` calls of `launch`, each `ops` ops; the slowest
/// thread's per-op time of each timed batch (µs). With a gate, each batch is enqueued behind it and
/// rank 0 opens it once every thread has enqueued; without, the threads start together from a
/// spinning barrier.
fn batches(
    runner: &impl Runner,
    team: &impl Team,
    timer: &Timer,
    s: &Settings,
    ops: u32,
    gate: Option<Gated>,
    launch: &dyn Fn() -> Res<()>,
) -> Result<Vec<f64>, Fatal> {
    let stream = runner.stream();
    let gate = gate.filter(|_| s.replays <= GATE_MAX_CALLS);
    let mut mine = Vec::new();
    for b in 0..s.warmup + s.batches {
        team.barrier();
        let (start, stop) = timer.events();
        let value = gate.map(|g| g.gate.next());
        let gated = match (gate, value) {
            (Some(g), Some(v)) => Gate::wait(g.device_ptr, v, stream),
            _ => Ok(()),
        };
        let enqueued = gated
            .and_then(|_| start.record(stream).map_err(|e| format!("cuEventRecord: {e:?}")))
            .and_then(|_| (0..s.replays).try_for_each(|_| launch()))
            .and_then(|_| stop.record(stream).map_err(|e| format!("cuEventRecord: {e:?}")));
        let all = agree(team, &enqueued);
        // Open the gate even when an enqueue failed: the streams that did enqueue must drain.
        if let (Some(g), Some(v)) = (gate, value) {
            if team.rank() == 0 {
                g.gate.open(v);
            }
        }
        all?;
        let us = timer.wait_per_call_us(s.replays * ops);
        agree(team, &us.as_ref().map(|_| ()).map_err(Clone::clone))?;
        let us = us.expect("agreed");
        if b >= s.warmup {
            mine.push(us);
        }
        watchdog::tick();
    }
    Ok(stats::slowest_per_batch(&team.gather(mine)))
}

/// Measures one row (see the module documentation). Every thread of the team calls it with the
/// same settings; all get the same result.
pub fn measure(
    runner: &impl Runner,
    team: &impl Team,
    timer: &Timer,
    s: &Settings,
    gate: Option<Gated>,
) -> Result<Measured, Fatal> {
    let mut m = Measured::default();
    let eager = || runner.enqueue();
    let one_op = if s.profiler { Some(capture(runner.stream(), || runner.enqueue())) } else { None };
    let first = || match &one_op {
        Some(Ok(g)) => g.launch().map_err(|e| format!("cuGraphLaunch: {e:?}")),
        Some(Err(e)) => Err(format!("graph capture: {e}")),
        None => eager(),
    };
    if let Err(e) = checked(runner, team, &first)? {
        m.status = Some(Status::Failed);
        m.note = format!("check before timing: {e}");
        return Ok(m);
    }
    let graph = capture(runner.stream(), || (0..s.graph_ops).try_for_each(|_| runner.enqueue()));
    let captured: Vec<Option<String>> = team.gather(graph.as_ref().err().cloned());
    if let Some((rank, e)) = captured.into_iter().enumerate().find_map(|(r, e)| e.map(|e| (r, e))) {
        m.status = Some(Status::Error);
        m.note = format!("graph capture on rank {rank}: {e}");
        return Ok(m);
    }
    let graph = graph.expect("every rank captured");
    let replay = || graph.launch().map_err(|e| format!("cuGraphLaunch: {e:?}"));
    m.graph = Some(stats::summarize(&batches(runner, team, timer, s, s.graph_ops, gate, &replay)?));
    if s.eager {
        // Eager is ungated: the host's launch cost is part of what it measures.
        m.eager = Some(stats::summarize(&batches(runner, team, timer, s, 1, None, &eager)?).median);
    }
    match checked(runner, team, &replay)? {
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
                self.say(format!("warning: writing the CSV: {e}"));
                self.csv = None;
            }
        }
        if matches!(r.status, Status::Failed | Status::Error) {
            self.say(format!(
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

    /// A line on stderr above the bar (indicatif drops `println` when stderr is not a terminal).
    pub fn say(&self, m: String) {
        if self.bar.is_hidden() {
            eprintln!("{m}");
        } else {
            self.bar.println(m);
        }
    }

    /// Progress as a plain line when there is no bar to show it (a log file).
    pub fn step(&self, m: String) {
        if self.bar.is_hidden() {
            eprintln!("[{}/{}] {m}", self.bar.position(), self.bar.length().unwrap_or(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn team_gathers_in_rank_order_round_after_round() {
        let meeting = Meeting::new(4);
        std::thread::scope(|s| {
            for rank in 0..4 {
                let meeting = &meeting;
                s.spawn(move || {
                    let team = Member { meeting, rank };
                    for round in 0..50usize {
                        let all = team.gather(rank * 1000 + round);
                        assert_eq!(all, (0..4).map(|r| r * 1000 + round).collect::<Vec<_>>());
                        let names = team.gather(format!("{rank}"));
                        assert_eq!(names.concat(), "0123");
                        team.barrier();
                    }
                });
            }
        });
        assert_eq!(Solo.gather(7), vec![7]);
    }
}
