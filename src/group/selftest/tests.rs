use super::*;
use crate::contract::{EAR_SELFTEST_NOT_SEEN, EAR_SELFTEST_PENDING};

const PASSED: u8 = EAR_SELFTEST_PASSED as u8;
const NOT_SEEN: u8 = EAR_SELFTEST_NOT_SEEN as u8;
const WRONG: u8 = EAR_SELFTEST_WRONG as u8;

/// The verdicts of a healthy group of `n` ranks, rank r on device 10 + r.
fn healthy(n: usize) -> Vec<RankVerdict> {
    (0..n)
        .map(|r| {
            let mut v = RankVerdict::not_run(r as i32, n as i32, 10 + r as i32);
            v.state = RankState::Finished;
            for q in (0..n).filter(|&q| q != r) {
                (v.write[q], v.read[q]) = (PASSED, PASSED);
            }
            v.elapsed_ns = 3_000;
            v
        })
        .collect()
}

/// `verdicts` as they arrive after a gather: each encoded, then decoded as its rank's.
fn gathered(verdicts: &[RankVerdict]) -> Vec<RankVerdict> {
    let n = verdicts.len() as i32;
    verdicts.iter().zip(0..).map(|(v, r)| RankVerdict::decode(&v.encode(), r, n)).collect()
}

#[test]
fn a_healthy_group_passes_at_every_rank_count() {
    for n in [1, 2, 4, 6, 8, 16] {
        assert_eq!(decide(&gathered(&healthy(n))), Ok(()), "{n} ranks");
    }
    assert_eq!(decide(&[]), Ok(()), "no ranks, no pairs");
}

#[test]
fn a_lost_write_names_its_pair_and_devices() {
    let mut v = healthy(4);
    v[2].write[1] = NOT_SEEN; // rank 1's token never arrived in rank 2's workspace
    let f = decide(&gathered(&v)).unwrap_err();
    assert_eq!((f.kind, f.a, f.b, f.device_a, f.device_b), (SelfTestKind::WriteLost, 1, Some(2), Some(11), Some(12)));
    assert!(f.others.is_empty(), "{:?}", f.others);
    assert!(!f.kernels_may_still_run());
    let text = Error::SelfTest(Box::new(f)).to_string();
    for says in [
        "rank 1 -> rank 2 (device 11 -> device 12)",
        "write lost",
        "ACS",
        "iommu=pt",
        "NCCL_P2P_DISABLE=1",
        "EDGELLM_ALLREDUCE_STRATEGY=nccl",
    ] {
        assert!(text.contains(says), "{text:?} should say {says:?}");
    }
    // A pending entry of a finished kernel (never written) is no pass either.
    v[2].write[1] = EAR_SELFTEST_PENDING as u8;
    assert_eq!(decide(&v).unwrap_err().kind, SelfTestKind::WriteLost);
}

#[test]
fn wrong_values_and_timed_out_reads_are_told_apart() {
    let mut v = healthy(2);
    v[0].read[1] = WRONG;
    let f = decide(&v).unwrap_err();
    assert_eq!((f.kind, f.a, f.b), (SelfTestKind::ReadWrong, 0, Some(1)));
    assert!(f.to_string().contains("(device 10 reading device 11)"), "{f}");
    v[0].read[1] = NOT_SEEN;
    assert_eq!(decide(&v).unwrap_err().kind, SelfTestKind::ReadTimedOut);
    let mut v = healthy(2);
    v[0].write[1] = WRONG;
    assert_eq!(decide(&v).unwrap_err().problem(), SelfTestProblem { kind: SelfTestKind::WriteWrong, a: 1, b: Some(0) });
    let mut v = healthy(2);
    v[1].read[0] = EAR_SELFTEST_UNMAPPED as u8;
    v[0].write[1] = NOT_SEEN; // rank 1 had no mapping of rank 0's workspace: nothing written either
    let f = decide(&v).unwrap_err();
    assert_eq!((f.kind, f.a, f.b), (SelfTestKind::MappingFailed, 1, Some(0)), "the mapping explains the lost write");
    assert_eq!(f.others, [SelfTestProblem { kind: SelfTestKind::WriteLost, a: 1, b: Some(0) }]);
}

#[test]
fn a_rank_that_never_ran_is_named_not_the_timeouts_it_caused() {
    let mut v = healthy(4);
    // Rank 2 never launched: every peer timed out on it, and it has no verdict.
    for r in [0, 1, 3] {
        (v[r].write[2], v[r].read[2]) = (NOT_SEEN, NOT_SEEN);
    }
    let mut bytes: Vec<Vec<u8>> = v.iter().map(|v| v.encode().to_vec()).collect();
    bytes[2] = Vec::new(); // nothing gathered from it
    let verdicts: Vec<RankVerdict> = bytes.iter().zip(0..).map(|(b, r)| RankVerdict::decode(b, r, 4)).collect();
    assert_eq!(verdicts[2], RankVerdict::not_run(2, 4, -1));
    let f = decide(&verdicts).unwrap_err();
    assert_eq!((f.kind, f.a, f.b, f.device_a), (SelfTestKind::NotRun, 2, None, None));
    assert!(f.others.is_empty(), "the peers' timeouts are explained by the missing rank: {:?}", f.others);
    let text = f.to_string();
    assert!(
        text.contains("rank 2 (device ?) ran no self-test kernel") && text.contains("not a fault of the links"),
        "{text}"
    );
    // Launched but its launch failed: the same, with the device known.
    v[2] = RankVerdict::not_run(2, 4, 12);
    assert_eq!(decide(&v).unwrap_err().problem(), SelfTestProblem { kind: SelfTestKind::NotRun, a: 2, b: None });
}

#[test]
fn a_kernel_that_did_not_finish_says_its_memory_must_stay() {
    let mut v = healthy(2);
    v[1].state = RankState::Unfinished;
    let f = decide(&gathered(&v)).unwrap_err();
    assert_eq!((f.kind, f.a, f.device_a), (SelfTestKind::DidNotFinish, 1, Some(11)));
    assert!(f.kernels_may_still_run());
    assert!(f.to_string().contains("never freed"), "{f}");
    // Also when another problem comes first.
    v[0] = RankVerdict::not_run(0, 2, 10);
    let f = decide(&v).unwrap_err();
    assert_eq!((f.kind, f.a), (SelfTestKind::NotRun, 0));
    assert!(f.kernels_may_still_run(), "{:?}", f.others);
    let mut v = healthy(2);
    v[0].state = RankState::Faulted;
    assert_eq!(decide(&v).unwrap_err().kind, SelfTestKind::Faulted);
}

#[test]
fn the_pair_reported_is_the_lowest_whatever_the_order_found() {
    let mut v = healthy(8);
    v[1].write[6] = NOT_SEEN; // 6 -> 1
    v[3].read[5] = WRONG; // 3 -> 5
    v[7].write[3] = WRONG; // 3 -> 7
    v[4].write[0] = NOT_SEEN; // 0 -> 4
    let f = decide(&gathered(&v)).unwrap_err();
    assert_eq!((f.kind, f.a, f.b), (SelfTestKind::WriteLost, 0, Some(4)));
    let others: Vec<(i32, Option<i32>)> = f.others.iter().map(|p| (p.a, p.b)).collect();
    assert_eq!(others, [(3, Some(5)), (3, Some(7)), (6, Some(1))]);
    assert!(f.to_string().contains("(and 3 more: read wrong 3 -> 5, write wrong 3 -> 7, write lost 6 -> 1)"), "{f}");
    // Every rank decides on the same gathered verdicts: the same failure everywhere.
    for _rank in 0..8 {
        assert_eq!(decide(&gathered(&v)).unwrap_err(), f);
    }
}

#[test]
fn verdicts_round_trip_and_anything_else_is_not_run() {
    let mut v = healthy(4)[3];
    v.write[1] = NOT_SEEN;
    v.elapsed_ns = u64::MAX - 5;
    assert_eq!(RankVerdict::decode(&v.encode(), 3, 4), v);
    assert_eq!(v.encode().len(), VERDICT_BYTES);
    let absent = RankVerdict::not_run(3, 4, -1);
    assert_eq!(RankVerdict::decode(&v.encode(), 2, 4), absent.with_rank(2), "another rank's verdict at this index");
    assert_eq!(RankVerdict::decode(&v.encode(), 3, 8), RankVerdict::not_run(3, 8, -1), "another rank count");
    assert_eq!(RankVerdict::decode(&[0u8; VERDICT_BYTES], 3, 4), absent, "zeros: no magic");
    assert_eq!(RankVerdict::decode(&v.encode()[..63], 3, 4), absent, "short");
    let mut odd = v.encode();
    odd[16] = 99;
    assert_eq!(RankVerdict::decode(&odd, 3, 4).state, RankState::NotRun, "an unknown state");
    // A verdict placed at another index than its rank counts as not run.
    let mut list = healthy(2);
    list.swap(0, 1);
    assert_eq!(decide(&list).unwrap_err().kind, SelfTestKind::NotRun);
}

#[test]
fn injections_become_the_ranks_masks() {
    let inject = SelfTestInjection {
        drop_writes: vec![(1, 2), (1, 0), (3, 1)],
        garble_writes: vec![(1, 3)],
        garble_own_slot: vec![1],
        not_launched: vec![2],
        ..Default::default()
    };
    assert_eq!(inject.for_rank(1), RankInjection { skip_mask: 0b101, garble_mask: 0b1010, ..Default::default() });
    assert_eq!(inject.for_rank(2), RankInjection { not_launched: true, ..Default::default() });
    assert_eq!(inject.for_rank(0), RankInjection::default());
    let ms = Duration::from_millis;
    let bounds = SelfTestInjection { bound: Some(ms(7)), ..Default::default() }.bounds().unwrap();
    assert_eq!(bounds, Bounds { kernel: ms(7), host: ms(7) + HOST_GRACE });
    let slow =
        SelfTestInjection { bound: Some(ms(7)), host_wait: Some(ms(60_000)), ..Default::default() }.bounds().unwrap();
    assert_eq!(slow, Bounds { kernel: ms(7), host: ms(60_000) });
}

#[test]
fn the_test_hooks_spec_becomes_each_ranks_masks() {
    // EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT as the exchange applies it: each rank its share.
    let inject = SelfTestInjection::parse("drop:0>1,garble:1>0,garble-slot:2,not-launched:3").unwrap();
    assert_eq!(inject.for_rank(0), RankInjection { skip_mask: 0b10, ..Default::default() });
    assert_eq!(inject.for_rank(1), RankInjection { garble_mask: 0b1, ..Default::default() });
    assert_eq!(inject.for_rank(2), RankInjection { garble_mask: 0b100, ..Default::default() });
    assert_eq!(inject.for_rank(3), RankInjection { not_launched: true, ..Default::default() });
    assert_eq!((inject.bound, inject.host_wait), (None, None), "the configured bounds");
    let inject = SelfTestInjection::parse("drop:0>1,host-wait:20").unwrap();
    assert_eq!(inject.host_wait, Some(Duration::from_millis(20)));
    assert!(SelfTestInjection::parse("host-wait:x").is_err());
    assert!(SelfTestInjection::parse("host-wait:60001").is_err());
}

#[test]
fn the_bound_is_short_and_the_host_waits_a_little_longer() {
    // The default bound (Bounds::configured reads the environment's, if any).
    let b = Bounds::new(Duration::from_millis(crate::config::DEFAULT_SELFTEST_MS));
    assert_eq!(b.kernel, Duration::from_millis(50));
    assert!(b.host > b.kernel && b.host < Duration::from_secs(2), "{b:?}");
    assert_eq!(b.kernel_ns(), 50_000_000);
    assert_eq!(Bounds::new(Duration::MAX).kernel_ns(), 1 << 62, "the kernel's deadline never wraps");
}

#[test]
fn the_area_follows_every_other_region_and_tokens_are_never_zero() {
    // SAFETY: pure arithmetic and constants of kernels/layout.c.
    unsafe {
        assert_eq!(ear_selftest_params_size(), std::mem::size_of::<EarSelfTestParams>() as u64);
        for (m, n) in [(1u64 << 20, 2), (16_000_000, 2), (8_000_000, 8), (1000, 16)] {
            let area = ear_selftest_offset(m, n);
            assert_eq!(
                crate::launch::family::workspace_bytes(m, n),
                area + 384,
                "m={m} n={n}: the area ends the workspace"
            );
            assert_eq!(area % 128, 0);
        }
    }
    assert_eq!(selftest_token(1, 2, 3), 0x5E1F_7E57_0003_0102);
    assert_eq!(selftest_token(0, 0, 0x1_0000), 0x5E1F_7E57_0000_0000, "16 bits of the round; never zero");
    assert_ne!(selftest_token(2, 1, 3), selftest_token(1, 2, 3));
}

impl RankVerdict {
    fn with_rank(mut self, rank: i32) -> RankVerdict {
        self.rank = rank;
        self
    }
}

#[test]
fn the_fault_hook_parses_every_kind() {
    let inject =
        SelfTestInjection::parse("drop:0>1, garble:2>3,garble-slot:1,not-launched:3,drop:15>0,host-wait:25").unwrap();
    assert_eq!(
        inject,
        SelfTestInjection {
            drop_writes: vec![(0, 1), (15, 0)],
            garble_writes: vec![(2, 3)],
            garble_own_slot: vec![1],
            not_launched: vec![3],
            host_wait: Some(Duration::from_millis(25)),
            ..Default::default()
        }
    );
    assert_eq!(SelfTestInjection::parse(" not-launched : 1 ").map(|f| f.not_launched), Ok(vec![1]));
    assert_eq!(SelfTestInjection::parse("reads:off").map(|f| f.probe_reads), Ok(Some(false)));
    assert_eq!(SelfTestInjection::parse("reads:on").map(|f| f.for_rank(3).probe_reads), Ok(Some(true)));
    assert!(SelfTestInjection::parse("reads:maybe").is_err());
}

#[test]
fn a_malformed_fault_spec_says_what_is_wrong() {
    for bad in [
        "drop",
        "drop:0",
        "drop:0>",
        "drop:0>0",
        "drop:0>16",
        "drop:-1>0",
        "garble:a>b",
        "not-launched:",
        "lose:0>1",
        "drop:0>1,",
        "host-wait:60001",
    ] {
        let why = SelfTestInjection::parse(bad).expect_err(bad);
        assert!(!why.is_empty(), "{bad}");
    }
}

#[test]
fn a_push_far_below_a_pcie_link_fails_the_group_and_says_how_fast_it_ran() {
    let verdict = |rank: i32, mbps: u32| {
        let mut v = RankVerdict::not_run(rank, 2, rank);
        v.state = RankState::Finished;
        v.write[(1 - rank) as usize] = EAR_SELFTEST_PASSED as u8;
        v.read[(1 - rank) as usize] = EAR_SELFTEST_SKIPPED as u8;
        v.push_mbps = mbps;
        v
    };
    assert_eq!(decide(&[verdict(0, 24_000), verdict(1, 0)]), Ok(()), "fast, or not measured");
    let f = decide(&[verdict(0, 30_000), verdict(1, 2_600)]).unwrap_err();
    assert_eq!((f.kind, f.a, f.b, f.push_mbps), (SelfTestKind::SlowLink, 1, Some(0), Some(2_600)));
    let text = f.to_string();
    assert!(
        text.contains("ran at 2.6 GB/s") && text.contains("(slow link)") && text.contains("probe --mode peers"),
        "{text}"
    );
    assert!(decide_with(&[verdict(0, 30_000), verdict(1, 30_000)], 40_000).is_err(), "the bound is the caller's");
    // The rate travels in the gathered bytes.
    let v = verdict(1, 2_600);
    assert_eq!(RankVerdict::decode(&v.encode(), 1, 2), v);
}
