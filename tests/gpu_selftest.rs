//! The peer self-test (`kernels/selftest.cu`, `src/group/selftest.rs`) on simulated ranks (N workspaces
//! on GPU 0, one stream per rank), through both of the library's paths: the in-process one
//! (`Group::self_test`: every rank's kernel launched by one host thread, then one decision) and
//! the one ranks in processes of their own take (`Group::self_test_each_rank`: one thread per rank
//! runs its kernel alone, the verdicts go through their byte encoding as a gather would carry
//! them, then every rank decides on all of them):
//!   - a healthy group of 2, 4 and 8 ranks passes, twice on the same workspaces (rounds), and
//!     its all-reduces before and after are correct (the self-test area is its own);
//!   - one rank's store to one peer dropped: "write lost", naming that pair, on every rank's
//!     decision; a garbled store and a garbled slot: "write wrong", "read wrong";
//!   - one rank never launched: every launched rank ends within the bound, and the decision
//!     names the missing rank;
//!   - a kernel still running at the host's deadline: the host returns at its deadline, names
//!     the rank "did not finish", and retires the group (its memory is never freed);
//!   - every run ends well under a second; only a generous bound (5 s) is asserted, to catch
//!     hangs, never a fine timing;
//!   - under compute-sanitizer (which serializes kernels, so a rank cannot see a peer that runs
//!     after it): the kernel touches only memory it owns ([`under_a_sanitizer_the_self_test_touches_only_its_memory`]).
//!
//! Needs a GPU, so every test is `#[ignore]`d: tools/gpu/contract_check.sh runs the binary with
//! `--ignored --test-threads 1` (the tests share GPU 0), and memcheck and racecheck on the
//! sanitizer test; tools/gpu/contract_check.sh runs them too.

use cudarc::driver::{CudaStream, DevicePtr as _};
use edgellm_allreduce::{
    self_test_decide, DataType, DevicePtr, Error, Family, Group, RankState, RankVerdict, SelfTestFailure,
    SelfTestInjection, SelfTestKind, Stream,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{gpu, Watchdog};

use edgellm_test_support as data;

/// The status codes of a verdict's entries (`EAR_SELFTEST_*`, src/contract.rs).
const PASSED: u8 = 1;
const NOT_SEEN: u8 = 2;
const SKIPPED: u8 = 5;

/// What "well under a second" is asserted as: only a hang fails it.
const HANG: Duration = Duration::from_secs(5);

const RANK_COUNTS: [i32; 3] = [2, 4, 8];

fn bound(ms: u64) -> Option<Duration> {
    Some(Duration::from_millis(ms))
}

/// The failure inside an error of the self-test.
fn failure(result: edgellm_allreduce::Result<()>) -> SelfTestFailure {
    match result {
        Err(Error::SelfTest(f)) => *f,
        other => panic!("expected a self-test failure, got {other:?}"),
    }
}

/// The in-process self-test of `group`, timed; fails on a hang.
fn in_process(group: &Group, inject: &SelfTestInjection) -> (edgellm_allreduce::Result<()>, Duration) {
    let start = Instant::now();
    let result = group.self_test(inject);
    let took = start.elapsed();
    assert!(took < HANG, "the self-test took {took:?}");
    (result, took)
}

/// The per-rank self-test of `group`, timed; fails on a hang.
fn each_rank(group: &Group, inject: &SelfTestInjection) -> Vec<RankVerdict> {
    let start = Instant::now();
    let verdicts = group.self_test_each_rank(inject).expect("every rank's part could be set up");
    let took = start.elapsed();
    assert!(took < HANG, "the self-test took {took:?}");
    assert_eq!(verdicts.len(), group.nranks as usize);
    verdicts
}

/// Every rank decides on the same gathered verdicts (what each rank of a multi-process group
/// does): all reach `expected`.
fn every_rank_decides(verdicts: &[RankVerdict], expected: &Result<(), SelfTestFailure>) {
    for rank in 0..verdicts.len() {
        assert_eq!(&self_test_decide(verdicts), expected, "rank {rank}'s decision");
    }
}

/// Whether `v` saw every peer's store and read every peer's slot, but for those in `except`.
fn all_passed_but(v: &RankVerdict, except: &[usize]) -> bool {
    (0..v.nranks as usize)
        .filter(|&q| q != v.rank as usize && !except.contains(&q))
        .all(|q| v.write[q] == PASSED && v.read[q] == PASSED)
}

/// One Lamport all-reduce on every rank of `group` (bf16), checked against the fp64 sum.
fn all_reduce_is_correct(group: &Group, streams: &[Arc<CudaStream>], seed: u64) {
    let count = 8192;
    let dtype = DataType::Bf16;
    let mut reference = vec![0f64; count];
    let inputs: Vec<Vec<u8>> =
        (0..group.nranks).map(|r| data::generate(count, dtype, seed + r as u64, Some(&mut reference))).collect();
    let bufs: Vec<_> = inputs.iter().zip(streams).map(|(h, s)| s.clone_htod(h).unwrap()).collect();
    let outs: Vec<_> = streams.iter().map(|s| s.clone_htod(&vec![data::POISON; count * 2]).unwrap()).collect();
    streams.iter().for_each(|s| s.synchronize().unwrap());
    for (rank, s) in streams.iter().enumerate() {
        let (input, output) = (DevicePtr(bufs[rank].device_ptr(s).0), DevicePtr(outs[rank].device_ptr(s).0));
        // SAFETY: device buffers of `count` elements (fresh allocations, 16-byte aligned); every
        // rank launches the same call.
        unsafe {
            group.launch(rank as i32, Family::Lamport, dtype, input, output, count, Stream(s.cu_stream() as usize))
        }
        .unwrap();
    }
    for (rank, s) in streams.iter().enumerate() {
        s.synchronize().unwrap();
        let check = data::check_output(&s.clone_dtoh(&outs[rank]).unwrap(), &reference, dtype);
        assert!(
            check.first_bad.is_none() && check.rel_err < check.tolerance,
            "rank {rank}: the all-reduce's sum ({check:?})"
        );
    }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn a_healthy_simulated_group_passes() {
    let ctx = gpu();
    let watchdog = Watchdog::start(Duration::from_secs(120));
    for nranks in RANK_COUNTS {
        watchdog.at(format!("healthy, {nranks} ranks"));
        let group = Group::simulated(0, nranks, 1 << 20).unwrap();
        let streams: Vec<_> = (0..nranks).map(|_| ctx.new_stream().unwrap()).collect();
        all_reduce_is_correct(&group, &streams, 1);
        // The configured bound (EDGELLM_ALLREDUCE_SELFTEST_MS, 50 ms by default), twice: the
        // second round must not pass on the first round's tokens, and does not need to.
        for round in 1..=2 {
            let (result, took) = in_process(&group, &SelfTestInjection::default());
            assert!(result.is_ok(), "{nranks} ranks, round {round}: {}", result.unwrap_err());
            println!("healthy, {nranks} ranks, round {round}: passed in {took:?}");
        }
        let verdicts = each_rank(&group, &SelfTestInjection::default());
        for v in &verdicts {
            assert_eq!(v.state, RankState::Finished, "{v:?}");
            assert!(all_passed_but(v, &[]), "{v:?}");
            assert!(v.elapsed_ns < 1_000_000_000, "rank {} took {} ns", v.rank, v.elapsed_ns);
        }
        every_rank_decides(&verdicts, &Ok(()));
        all_reduce_is_correct(&group, &streams, 100);
        assert_eq!(group.fault(), None);
        assert!(!group.is_retired());
    }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn without_pulling_families_the_self_test_issues_no_peer_load() {
    // A group on which no family loads from its peers (PCIe without a tuning file that chose
    // one, or peer reads unsupported) probes the write path alone: every kernel reports its reads
    // SKIPPED (it issued no peer load), the writes PASSED, and the group passes; a dropped write
    // still fails it.
    let _ctx = gpu();
    let watchdog = Watchdog::start(Duration::from_secs(120));
    let no_reads = SelfTestInjection { probe_reads: Some(false), bound: bound(50), ..Default::default() };
    for nranks in [2, 4, 8] {
        watchdog.at(format!("reads not probed, {nranks} ranks"));
        let group = Group::simulated(0, nranks, 1 << 20).unwrap();
        let verdicts = each_rank(&group, &no_reads);
        for v in &verdicts {
            assert_eq!(v.state, RankState::Finished, "{v:?}");
            for q in (0..nranks as usize).filter(|&q| q != v.rank as usize) {
                assert_eq!((v.write[q], v.read[q]), (PASSED, SKIPPED), "rank {} of {nranks}, peer {q}: {v:?}", v.rank);
            }
        }
        every_rank_decides(&verdicts, &Ok(()));
        assert!(in_process(&group, &no_reads).0.is_ok());
        let dropped = SelfTestInjection { drop_writes: vec![(0, 1)], ..no_reads.clone() };
        let verdicts = each_rank(&group, &dropped);
        let decided = self_test_decide(&verdicts).unwrap_err();
        assert_eq!((decided.kind, decided.a, decided.b), (SelfTestKind::WriteLost, 0, Some(1)), "{decided}");
        println!("reads not probed, {nranks} ranks: every read SKIPPED, writes checked");
    }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn the_bandwidth_check_times_each_ranks_push_and_fails_a_slow_one() {
    // Simulated ranks share one device, where the check does not run by itself (no link to
    // time): forced here. Every rank reports its rate; the group passes above the bound and
    // fails, naming the slowest rank's push, below it.
    let _ctx = gpu();
    let watchdog = Watchdog::start(Duration::from_secs(120));
    let measured = SelfTestInjection { measure_push: Some(true), bound: bound(50), ..Default::default() };
    for nranks in [2, 4, 8] {
        watchdog.at(format!("bandwidth check, {nranks} ranks"));
        let group = Group::simulated(0, nranks, 1 << 20).unwrap();
        let verdicts = each_rank(&group, &measured);
        for v in &verdicts {
            assert_eq!(v.state, RankState::Finished, "{v:?}");
            assert!(v.push_mbps > 0, "rank {} of {nranks} measured no push: {v:?}", v.rank);
        }
        let rates: Vec<u32> = verdicts.iter().map(|v| v.push_mbps).collect();
        every_rank_decides(&verdicts, &Ok(()));
        assert!(in_process(&group, &measured).0.is_ok());
        let strict = SelfTestInjection { min_push_mbps: Some(u32::MAX), ..measured.clone() };
        let f = failure(in_process(&group, &strict).0);
        assert_eq!(f.kind, SelfTestKind::SlowLink, "{f}");
        assert!(f.push_mbps.is_some_and(|m| m > 0), "{f}");
        println!("bandwidth check, {nranks} ranks on one device: {rates:?} MB/s; under an impossible bound: {f}");
    }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn a_dropped_write_is_named_write_lost_on_every_rank() {
    let _ctx = gpu();
    let watchdog = Watchdog::start(Duration::from_secs(120));
    for nranks in RANK_COUNTS {
        // Rank 1's store into the last rank's workspace is dropped.
        let (from, to) = (1, nranks - 1);
        let (from, to) = if from == to { (1, 0) } else { (from, to) };
        watchdog.at(format!("write {from} -> {to} dropped, {nranks} ranks"));
        let group = Group::simulated(0, nranks, 1 << 20).unwrap();
        let inject = SelfTestInjection { drop_writes: vec![(from, to)], bound: bound(50), ..Default::default() };
        let (result, took) = in_process(&group, &inject);
        let f = failure(result);
        assert_eq!(
            (f.kind, f.a, f.b, f.device_a, f.device_b),
            (SelfTestKind::WriteLost, from, Some(to), Some(0), Some(0)),
            "{f}"
        );
        assert!(f.others.is_empty(), "{f}");
        assert!(!f.kernels_may_still_run());
        println!("{nranks} ranks, write {from} -> {to} dropped: failed in {took:?}: {f}");

        let verdicts = each_rank(&group, &inject);
        for v in &verdicts {
            assert_eq!(v.state, RankState::Finished, "every kernel ends at its bound: {v:?}");
            if v.rank == to {
                assert_eq!(v.write[from as usize], NOT_SEEN, "{v:?}");
                assert_eq!(v.read[from as usize], PASSED, "the reads of rank {from} work: {v:?}");
                assert!(all_passed_but(v, &[from as usize]), "{v:?}");
            } else {
                assert!(all_passed_but(v, &[]), "{v:?}");
            }
        }
        let decided = self_test_decide(&verdicts);
        assert_eq!(decided.as_ref().map_err(|f| (f.kind, f.a, f.b)), Err((SelfTestKind::WriteLost, from, Some(to))));
        every_rank_decides(&verdicts, &decided);
        assert!(!group.is_retired(), "a failed self-test leaves the decision to the caller");
    }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn garbled_tokens_are_named_write_wrong_and_read_wrong() {
    let _ctx = gpu();
    let _watchdog = Watchdog::of("garbled tokens", Duration::from_secs(60));
    let group = Group::simulated(0, 4, 1 << 20).unwrap();
    let inject = SelfTestInjection { garble_writes: vec![(2, 3)], bound: bound(50), ..Default::default() };
    let f = failure(in_process(&group, &inject).0);
    assert_eq!((f.kind, f.a, f.b), (SelfTestKind::WriteWrong, 2, Some(3)), "{f}");
    // Rank 3's own slot garbled: every peer's read of it is wrong; the lowest pair is reported.
    let inject = SelfTestInjection { garble_own_slot: vec![3], bound: bound(50), ..Default::default() };
    let f = failure(in_process(&group, &inject).0);
    assert_eq!((f.kind, f.a, f.b), (SelfTestKind::ReadWrong, 0, Some(3)), "{f}");
    let others: Vec<_> = f.others.iter().map(|p| (p.kind, p.a, p.b)).collect();
    assert_eq!(others, [(SelfTestKind::ReadWrong, 1, Some(3)), (SelfTestKind::ReadWrong, 2, Some(3))]);
    let verdicts = each_rank(&group, &inject);
    every_rank_decides(&verdicts, &self_test_decide(&verdicts));
    assert_eq!(self_test_decide(&verdicts).unwrap_err().problem(), f.problem());
    // And the same workspaces pass a clean round afterwards.
    assert!(in_process(&group, &SelfTestInjection::default()).0.is_ok());
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn a_rank_never_launched_is_named_and_the_others_end_within_the_bound() {
    let _ctx = gpu();
    let watchdog = Watchdog::start(Duration::from_secs(120));
    for nranks in RANK_COUNTS {
        let missing = nranks / 2;
        watchdog.at(format!("rank {missing} of {nranks} never launched"));
        let group = Group::simulated(0, nranks, 1 << 20).unwrap();
        let inject = SelfTestInjection { not_launched: vec![missing], bound: bound(50), ..Default::default() };
        let (result, took) = in_process(&group, &inject);
        let f = failure(result);
        assert_eq!((f.kind, f.a, f.b), (SelfTestKind::NotRun, missing, None), "{f}");
        assert!(f.others.is_empty(), "the timeouts on the missing rank are not reported apart: {f}");
        println!("{nranks} ranks, rank {missing} never launched: failed in {took:?}: {f}");

        let verdicts = each_rank(&group, &inject);
        for v in &verdicts {
            if v.rank == missing {
                assert_eq!(v.state, RankState::NotRun, "its verdict never arrived: {v:?}");
                continue;
            }
            assert_eq!(v.state, RankState::Finished, "a launched rank ends at its bound: {v:?}");
            assert_eq!((v.write[missing as usize], v.read[missing as usize]), (NOT_SEEN, NOT_SEEN), "{v:?}");
            assert!(all_passed_but(v, &[missing as usize]), "{v:?}");
            assert!(v.elapsed_ns >= 50_000_000 && v.elapsed_ns < 1_000_000_000, "waited the bound, no more: {v:?}");
        }
        let decided = self_test_decide(&verdicts);
        assert_eq!(decided.as_ref().map_err(|f| (f.kind, f.a, f.b)), Err((SelfTestKind::NotRun, missing, None)));
        every_rank_decides(&verdicts, &decided);
    }
}

#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn a_kernel_running_past_the_hosts_deadline_is_reported_and_its_group_retired() {
    let _ctx = gpu();
    let _watchdog = Watchdog::of("a kernel past the host's deadline", Duration::from_secs(60));
    // Rank 0 never gets rank 1's token and waits its whole bound (3 s); the host gives up after
    // 200 ms, as it would on a kernel stalled on a peer load. The kernel ends later by itself.
    let group = Group::simulated(0, 2, 1 << 20).unwrap();
    let inject = SelfTestInjection {
        drop_writes: vec![(1, 0)],
        bound: bound(3_000),
        host_wait: bound(200),
        ..Default::default()
    };
    let start = Instant::now();
    let f = failure(group.self_test(&inject));
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(2_500),
        "the host waited for the kernel ({took:?}): it must give up at its own deadline"
    );
    assert_eq!((f.kind, f.a, f.b), (SelfTestKind::DidNotFinish, 0, None), "{f}");
    assert!(f.kernels_may_still_run() && f.to_string().contains("never freed"), "{f}");
    assert!(group.is_retired(), "a group whose self-test left a kernel running takes no more launches");
    // Dropping it leaks its memory (logged) instead of waiting for the device.
    drop(group);
    // Let the kernel end before the next test uses the device.
    std::thread::sleep(Duration::from_millis(3_200));
}

/// Run under compute-sanitizer (memcheck, racecheck) by tools/gpu/contract_check.sh: the sanitizer
/// serializes kernels, so a rank whose peer runs after it cannot see it (its write and read of
/// that peer time out), and it slows every store a thousandfold (the bandwidth check, forced on
/// so that the sanitizer sees its kernel too, finds the link slow: 0.2 GB/s under racecheck on
/// an H100); the test accepts both and only asks that every kernel ends and reports. The
/// sanitizer's exit code says whether any kernel touched memory it does not own.
#[test]
#[ignore = "needs a GPU: run with --ignored on the GPU machine"]
fn under_a_sanitizer_the_self_test_touches_only_its_memory() {
    let _ctx = gpu();
    let _watchdog = Watchdog::of("the self-test under a sanitizer", Duration::from_secs(280));
    for nranks in [2, 4] {
        let group = Group::simulated(0, nranks, 1 << 20).unwrap();
        let inject = SelfTestInjection {
            bound: bound(200),
            host_wait: Some(Duration::from_secs(120)),
            measure_push: Some(true),
            ..Default::default()
        };
        match group.self_test(&inject) {
            Ok(()) => println!("{nranks} ranks: passed (kernels ran concurrently)"),
            Err(Error::SelfTest(f)) => {
                assert!(
                    matches!(f.kind, SelfTestKind::WriteLost | SelfTestKind::ReadTimedOut | SelfTestKind::SlowLink),
                    "only timeouts on later ranks, or a sanitizer's slow stores: {f}"
                );
                assert!(!f.kernels_may_still_run(), "{f}");
                println!("{nranks} ranks: {:?} {} -> {:?} (kernels serialized)", f.kind, f.a, f.b);
            }
            Err(e) => panic!("{nranks} ranks: {e}"),
        }
        // The last rank to run sees every peer, which ran before it or beside it.
        let verdicts = each_rank_under_sanitizer(&group, &inject);
        assert!(verdicts.iter().all(|v| v.state == RankState::Finished), "{verdicts:?}");
        // A faulty write must still be found when kernels are serialized: the pair's writer
        // never writes, so its reader cannot see it however the kernels run.
        let dropped = SelfTestInjection { drop_writes: vec![(0, 1)], ..inject.clone() };
        let verdicts = each_rank_under_sanitizer(&group, &dropped);
        assert_eq!(verdicts[1].write[0], NOT_SEEN, "{:?}", verdicts[1]);
    }
}

/// [`each_rank`] without its hang bound (the sanitizer makes each kernel's launch slow).
fn each_rank_under_sanitizer(group: &Group, inject: &SelfTestInjection) -> Vec<RankVerdict> {
    group.self_test_each_rank(inject).expect("every rank's part could be set up")
}
