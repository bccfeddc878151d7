//! The cross-rank contract on one GPU, through the library's own launch paths (`Group`, the
//! plugin's enqueue), on simulated ranks (N workspaces on GPU 0, a stream per rank):
//!   - a rank that skips its launch leaves its peers with a fault and NaN outputs, never a hang or
//!     a stream error, in every kernel
//!     family (plain and fused, the paced two-shot too); the group then refuses launches, and a
//!     new group on the device works;
//!   - a CUDA graph keeps the memory of the group it captured, and a replay after the release
//!     only fills its outputs with NaN and reports it (run under compute-sanitizer memcheck too);
//!   - two streams enqueue at once: the first to claim the rank runs the custom kernel, the other
//!     the registered NCCL.
//!
//! Needs a GPU, so every test is `#[ignore]`d: tools/gpu/contract_check.sh runs the binary with
//! `--ignored --test-threads 1` (the tests share GPU 0's fault word and the group table).

use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtr as _};
use edgellm_allreduce::abi::{edgellmAllReduceLastError, edgellmRegisterNcclCommForAllReducePlugin};
use edgellm_allreduce::{
    DataType, DevicePtr, Error, Family, Fault, FusedCall, Group, PluginConfig, PluginCore, Stream, TensorDesc,
};
use edgellm_test_support::{check_output, generate, POISON};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

mod common;
use common::{gpu, Watchdog};

fn stream_of(s: &CudaStream) -> Stream {
    Stream(s.cu_stream() as usize)
}

fn ptr(buf: &CudaSlice<u8>, s: &CudaStream) -> DevicePtr {
    DevicePtr(buf.device_ptr(s).0)
}

/// What one rank's call of a case runs.
#[derive(Clone, Copy, Debug)]
enum Op {
    Plain(Family, usize),
    Fused(Family, u64, u32),
}

/// Launches rank `rank`'s part of `op` (bf16, zero inputs, zero outputs) on `s` and waits for
/// it: the stream must show no error. Returns the outputs (the fused op's residual and normed).
fn launch(group: &Group, rank: i32, op: Op, s: &Arc<CudaStream>) -> edgellm_allreduce::Result<Vec<Vec<u8>>> {
    let dtype = DataType::Bf16;
    match op {
        Op::Plain(family, count) => {
            let (input, output) = (s.alloc_zeros::<u8>(count * 2).unwrap(), s.alloc_zeros::<u8>(count * 2).unwrap());
            // SAFETY: fresh device buffers of `count` elements (16-byte aligned allocations); the
            // test decides which ranks launch.
            let r = unsafe { group.launch(rank, family, dtype, ptr(&input, s), ptr(&output, s), count, stream_of(s)) };
            s.synchronize().expect("the stream shows no error, whatever the call met");
            r.map(|()| vec![s.clone_dtoh(&output).unwrap()])
        }
        Op::Fused(family, tokens, hidden) => {
            let n = tokens as usize * hidden as usize * 2;
            let bufs: Vec<CudaSlice<u8>> = (0..4).map(|_| s.alloc_zeros::<u8>(n).unwrap()).collect();
            let gamma = s.alloc_zeros::<u8>(hidden as usize * 2).unwrap();
            let call = FusedCall {
                x: ptr(&bufs[0], s),
                residual: ptr(&bufs[1], s),
                bias: DevicePtr::NULL,
                gamma: ptr(&gamma, s),
                residual_out: ptr(&bufs[2], s),
                normed: ptr(&bufs[3], s),
                tokens,
                hidden,
                eps: 1e-6,
            };
            // SAFETY: as above, for every tensor of the call.
            let r = unsafe { group.launch_fused(rank, family, dtype, &call, stream_of(s)) };
            s.synchronize().expect("the stream shows no error, whatever the call met");
            r.map(|()| bufs[2..].iter().map(|b| s.clone_dtoh(b).unwrap()).collect())
        }
    }
}

/// The cases: every family, plain and fused; the two-shot small (polled) and past 8 MiB (paced
/// by flags).
const OPS: [Op; 7] = [
    Op::Plain(Family::Lamport, 512),
    Op::Plain(Family::OneShot, 32 << 10),
    Op::Plain(Family::TwoShot, 32 << 10),
    Op::Plain(Family::TwoShot, 9 << 19), // 9 MiB of bf16
    Op::Fused(Family::Lamport, 4, 4096),
    Op::Fused(Family::OneShot, 4, 4096),
    Op::Fused(Family::TwoShot, 4, 4096),
];

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn a_skipped_rank_ends_its_peers_with_a_timeout_not_a_hang() {
    let ctx = gpu();
    let watchdog = Watchdog::start(Duration::from_secs(120));
    let mut cases = 0;
    // Which ranks launch: one of two; three of four (rank 2 skips).
    for (nranks, launched) in [(2, &[0][..]), (4, &[0, 1, 3][..])] {
        let streams: Vec<_> = (0..nranks).map(|_| ctx.new_stream().unwrap()).collect();
        for op in OPS {
            watchdog.at(format!("{op:?}, {nranks} ranks, launched {launched:?}"));
            let mut group = Group::simulated(0, nranks, 16 << 20).unwrap();
            group.timeout_ns = 100_000_000;
            // Every launched rank's kernel waits for the skipped one, gives up after 100 ms and
            // returns: each launch is followed by its stream's synchronization, one at a time.
            // Its stream shows no error, and its outputs are NaN (every byte 0xFF): zero inputs
            // sum to zero, so an output left as it was would look like a result.
            let threads: Vec<_> = launched
                .iter()
                .map(|&r| {
                    let (s, g) = (streams[r as usize].clone(), &group);
                    (r, s, g)
                })
                .collect();
            std::thread::scope(|scope| {
                for (r, s, g) in threads {
                    let ctx = ctx.clone();
                    scope.spawn(move || {
                        ctx.bind_to_thread().unwrap();
                        for (i, out) in launch(g, r, op, &s).unwrap().iter().enumerate() {
                            assert!(out.iter().all(|&b| b == 0xff), "{op:?}: rank {r}'s output {i} is not all NaN");
                        }
                    });
                }
            });
            assert_eq!(group.fault(), Some(Fault::TimedOut), "{op:?}, {nranks} ranks");
            assert_eq!(edgellmAllReduceLastError(0), 1, "the C API reads the same fault word");
            for r in 0..nranks {
                let refused =
                    launch(&group, r, op, &streams[r as usize]).expect_err("a group with a fault launches nothing");
                assert!(matches!(refused, Error::GroupFault { device: 0, .. }), "{refused}");
            }
            cases += 1;
        }
    }
    // A new group on the device is not affected by the old groups' faults.
    watchdog.at("a new group after the faults".into());
    let group = Group::simulated(0, 2, 1 << 20).unwrap();
    let streams: Vec<_> = (0..2).map(|_| ctx.new_stream().unwrap()).collect();
    std::thread::scope(|scope| {
        for (r, s) in streams.iter().enumerate() {
            let (ctx, group) = (ctx.clone(), &group);
            scope.spawn(move || {
                ctx.bind_to_thread().unwrap();
                launch(group, r as i32, Op::Plain(Family::Lamport, 4096), s).unwrap();
            });
        }
    });
    assert_eq!(group.fault(), None);
    println!("skipped ranks: {cases} cases ended with a timeout");
    assert_eq!(cases, 14);
}

/// One all-reduce of `inputs` on both ranks of `group`, forked from `origin` and joined back
/// (as one graph can capture it): rank r on `streams[r]`, into `outputs[r]`.
fn fork_join(
    ctx: &Arc<CudaContext>,
    group: &Arc<Group>,
    origin: &Arc<CudaStream>,
    streams: &[Arc<CudaStream>],
    inputs: &[CudaSlice<u8>],
    outputs: &[CudaSlice<u8>],
    count: usize,
) {
    let fork = ctx.new_event(None).unwrap();
    fork.record(origin).unwrap();
    for (r, s) in streams.iter().enumerate() {
        s.wait(&fork).unwrap();
        // SAFETY: device buffers of `count` elements; both ranks launch the same call.
        unsafe {
            group.launch(
                r as i32,
                Family::Lamport,
                DataType::Bf16,
                ptr(&inputs[r], s),
                ptr(&outputs[r], s),
                count,
                stream_of(s),
            )
        }
        .unwrap();
        group.hold_for_capture(stream_of(s)).unwrap();
        origin.join(s).unwrap();
    }
}

/// A graph of one Lamport all-reduce on both ranks of a fresh simulated group, its inputs and
/// poisoned outputs, the fp64 reference, and the streams.
struct Captured {
    group: Arc<Group>,
    graph: cudarc::driver::CudaGraph,
    origin: Arc<CudaStream>,
    _streams: Vec<Arc<CudaStream>>,
    _inputs: Vec<CudaSlice<u8>>,
    outputs: Vec<CudaSlice<u8>>,
    reference: Vec<f64>,
    poison: Vec<u8>,
}

fn capture(ctx: &Arc<CudaContext>) -> Captured {
    let count = 4096;
    let group = Arc::new(Group::simulated(0, 2, 1 << 20).unwrap());
    let origin = ctx.new_stream().unwrap();
    let streams: Vec<_> = (0..2).map(|_| ctx.new_stream().unwrap()).collect();
    let mut reference = vec![0f64; count];
    let host: Vec<Vec<u8>> =
        (0..2).map(|r| generate(count, DataType::Bf16, r as u64 + 11, Some(&mut reference))).collect();
    let inputs: Vec<_> = host.iter().map(|h| origin.clone_htod(h).unwrap()).collect();
    let poison = vec![POISON; count * 2];
    let outputs: Vec<_> = (0..2).map(|_| origin.clone_htod(&poison).unwrap()).collect();
    origin.synchronize().unwrap();
    assert!(!group.hold_for_capture(stream_of(&origin)).unwrap(), "not capturing: nothing to hold");
    origin.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL).unwrap();
    fork_join(ctx, &group, &origin, &streams, &inputs, &outputs, count);
    let graph = origin.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("a graph");
    Captured { group, graph, origin, _streams: streams, _inputs: inputs, outputs, reference, poison }
}

/// Releases the captured group (retire, drop the last reference outside the graph), replays
/// the graph: the kernels must do nothing but fill their outputs with NaN (every byte 0xFF, over
/// a marker written before) and report fault 3; then
/// destroys the graph: its references go, and the memory is freed at the next safe point.
fn release_then_replay(c: Captured) {
    let Captured { group, graph, origin, mut outputs, poison, .. } = c;
    let weak = Arc::downgrade(&group);
    group.retire();
    drop(group);
    assert!(weak.upgrade().is_some(), "the graph holds the released group: its memory stays");
    let marker = vec![0x11u8; poison.len()];
    for out in outputs.iter_mut() {
        origin.memcpy_htod(&marker, out).unwrap();
    }
    origin.synchronize().unwrap();
    graph.launch().unwrap();
    origin.synchronize().unwrap();
    assert_eq!(edgellmAllReduceLastError(0), 3, "a replay of a released group's kernel is reported");
    for (r, out) in outputs.iter().enumerate() {
        let bytes = origin.clone_dtoh(out).unwrap();
        assert!(bytes.iter().all(|&b| b == 0xff), "rank {r}: a released group's replay left something other than NaN");
    }
    drop(graph);
    // The driver drops the graph's references on a thread of its own, soon after.
    let mut waited = 0;
    while weak.upgrade().is_some() && waited < 100 {
        std::thread::sleep(Duration::from_millis(100));
        waited += 1;
    }
    assert!(weak.upgrade().is_none(), "destroying the graph releases its references");
    assert!(edgellm_allreduce::free_released_memory() >= 2, "the workspaces are freed at the next safe point");
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn a_graph_keeps_the_group_it_captured_and_a_replay_after_the_release_writes_only_nan() {
    let (ctx, _watchdog) = (gpu(), Watchdog::of("capture, replay, release, replay", Duration::from_secs(120)));
    let c = capture(&ctx);
    c.graph.launch().unwrap();
    c.origin.synchronize().unwrap();
    for (r, out) in c.outputs.iter().enumerate() {
        let bytes = c.origin.clone_dtoh(out).unwrap();
        let check = check_output(&bytes, &c.reference, DataType::Bf16);
        assert!(
            check.first_bad.is_none() && check.rel_err < check.tolerance,
            "rank {r}: the replay before the release"
        );
    }
    assert_eq!(c.group.fault(), None);
    release_then_replay(c);
    println!(
        "graph lifetime: correct replay, release, replay that only wrote NaN (fault 3), memory freed after the graph"
    );
}

/// The same without the replay before the release, whose two ranks must run at once: this one
/// runs under compute-sanitizer (which serializes kernels): the replay after the release reads
/// the group's memory (its state and abort words) and must find it alive.
#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn a_replay_after_the_release_touches_only_live_memory() {
    let (ctx, _watchdog) = (gpu(), Watchdog::of("capture, release, replay", Duration::from_secs(300)));
    release_then_replay(capture(&ctx));
    println!("graph lifetime: release, replay that only wrote NaN (fault 3), memory freed after the graph");
}

/// What the registered stand-in for ncclAllReduce was called with: the streams.
static NCCL_STREAMS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// A stand-in for ncclAllReduce: records the stream, does nothing.
unsafe extern "C" fn fake_nccl_all_reduce(
    _: *const std::ffi::c_void,
    _: *mut std::ffi::c_void,
    _: usize,
    _: i32,
    _: i32,
    _: *mut std::ffi::c_void,
    stream: *mut std::ffi::c_void,
) -> i32 {
    NCCL_STREAMS.lock().unwrap().push(stream as usize);
    0
}

fn bf16_desc(count: usize) -> TensorDesc {
    let mut dims = [0i64; 8];
    dims[0] = count as i64;
    TensorDesc { nb_dims: 1, dims, dtype: 7, format: 0 }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn two_streams_at_once_one_runs_the_custom_kernel_the_other_nccl() {
    let (ctx, _watchdog) = (gpu(), Watchdog::of("two streams at once", Duration::from_secs(120)));
    let count = 8192;
    // Device 0 registered as Edge-LLM does (a stand-in NCCL: no group forms by itself), then rank
    // 0 of a simulated group installed for it; rank 1 is driven directly.
    let comm = 0xc0 as *mut std::ffi::c_void;
    // SAFETY: a stand-in communicator that only the stand-in ncclAllReduce reads.
    assert!(unsafe {
        edgellmRegisterNcclCommForAllReducePlugin(0, comm, fake_nccl_all_reduce as *mut std::ffi::c_void)
    });
    let group = Arc::new(Group::simulated(0, 2, 1 << 20).unwrap());
    edgellm_allreduce::install_for_tests(0, group.clone(), 0);
    let plugin = PluginCore::new(PluginConfig::with_tp_size(2).unwrap()).unwrap();

    let mut reference = vec![0f64; count];
    let host: Vec<Vec<u8>> =
        (0..2).map(|r| generate(count, DataType::Bf16, r as u64 + 21, Some(&mut reference))).collect();
    let streams: Vec<_> = (0..2).map(|_| ctx.new_stream().unwrap()).collect();
    let rank1 = ctx.new_stream().unwrap();
    let inputs: Vec<_> = (0..2).map(|_| rank1.clone_htod(&host[0]).unwrap()).collect();
    let outputs: Vec<_> = (0..2).map(|_| rank1.clone_htod(&vec![POISON; count * 2]).unwrap()).collect();
    let (in1, out1) = (rank1.clone_htod(&host[1]).unwrap(), rank1.clone_htod(&vec![POISON; count * 2]).unwrap());
    rank1.synchronize().unwrap();

    let mut owner = None;
    for round in 0..3 {
        NCCL_STREAMS.lock().unwrap().clear();
        // Both streams enqueue rank 0's all-reduce at once.
        let start = Barrier::new(2);
        std::thread::scope(|scope| {
            for (i, s) in streams.iter().enumerate() {
                let (ctx, plugin, start) = (ctx.clone(), &plugin, &start);
                let (input, output) = (ptr(&inputs[i], s).0 as usize, ptr(&outputs[i], s).0 as usize);
                scope.spawn(move || {
                    ctx.bind_to_thread().unwrap();
                    start.wait();
                    plugin
                        .enqueue(&[bf16_desc(count)], &[bf16_desc(count)], &[input], &[output], s.cu_stream() as usize)
                        .unwrap();
                });
            }
        });
        let nccl = NCCL_STREAMS.lock().unwrap().clone();
        assert_eq!(nccl.len(), 1, "round {round}: exactly one of the two streams went to NCCL: {nccl:?}");
        let custom =
            streams.iter().position(|s| s.cu_stream() as usize != nccl[0]).expect("the other stream ran the kernel");
        // Rank 1's part of the custom call, so that it completes.
        // SAFETY: device buffers of `count` elements; the same call as rank 0's.
        unsafe {
            group.launch(
                1,
                Family::Lamport,
                DataType::Bf16,
                ptr(&in1, &rank1),
                ptr(&out1, &rank1),
                count,
                stream_of(&rank1),
            )
        }
        .unwrap();
        rank1.synchronize().unwrap();
        streams[custom].synchronize().unwrap();
        for bytes in [streams[custom].clone_dtoh(&outputs[custom]).unwrap(), rank1.clone_dtoh(&out1).unwrap()] {
            let check = check_output(&bytes, &reference, DataType::Bf16);
            assert!(
                check.first_bad.is_none() && check.rel_err < check.tolerance,
                "round {round}: the custom call's sum"
            );
        }
        assert_eq!(
            *owner.get_or_insert(custom),
            custom,
            "round {round}: the stream that won the first round keeps the group"
        );
    }
    assert_eq!(group.fault(), None);
    // SAFETY: only compared.
    assert!(unsafe { edgellm_allreduce::abi::edgellmUnregisterNcclCommForAllReducePlugin(0, comm) });
    println!("two streams: the first owns the group, the other ran NCCL, three rounds");
}
