use super::*;
use crate::contract::EAR_MAX_BLOCKS;
use crate::launch::family::Family;
use crate::launch::strategy::Requested;

const SETTINGS: Settings = Settings { strategy: 0, max_bytes: 16_000_000, tables: 0x1234, tuning: 0 };

fn record(rank: i32) -> Record {
    Record {
        ok: true,
        nranks: 2,
        rank,
        host: host_id(),
        handle: [rank as u8; 64],
        max_blocks: 128 - rank as u32,
        settings: SETTINGS,
        bus: bus_bytes("0000:17:00.0"),
    }
}
fn round_trip(r: &Record) -> Option<Record> {
    Record::decode(&r.encode())
}

#[test]
fn exchange_records_round_trip() {
    let mut r = record(1);
    r.settings.strategy = 4;
    r.settings.tuning = 0xfeed_beef_0000_0001;
    assert_eq!(round_trip(&r), Some(r));
    assert_eq!(r.encode().len(), 256, "the record's size never changes");
    assert!(Record::decode(&[0u8; RECORD_BYTES]).is_none(), "no magic, no record");
    assert!(Record::decode(&[0u8; 8]).is_none());
    for older in [0x4541_5232u32, 0x4541_5234, 0x4541_5235, 0x4541_5236, 0x4541_5237, 0x4541_5238, 0x4541_5239] {
        // "EAR2": two-shot with a barrier; "EAR4": unbounded waits, no abort word; "EAR5":
        // either bounded waits or the pulling two-shot at 4+ ranks, not both; "EAR6": no
        // pointer slots (a 32 KiB signal region); "EAR7": 8-byte pointer slots, released;
        // "EAR8": no self-test area (a shorter workspace); "EAR9": no push region, reads always probed.
        let mut b = record(1).encode();
        b[0..4].copy_from_slice(&older.to_le_bytes());
        assert!(Record::decode(&b).is_none(), "a build with an earlier kernel protocol");
    }
}

/// The verdict of two ranks when rank 1's record is changed by `f`.
fn verdict(f: &dyn Fn(&mut Record)) -> std::result::Result<u32, String> {
    let mut one = record(1);
    f(&mut one);
    agree(&[round_trip(&record(0)), round_trip(&one)], 2)
}

#[test]
fn all_ranks_join_or_none_and_the_log_names_the_difference() {
    assert_eq!(verdict(&|_| {}), Ok(127), "the smallest grid cap");
    assert_eq!(verdict(&|r| r.max_blocks = 66), Ok(66), "grid caps may differ: the group takes the smallest");
    let refused = [
        (verdict(&|r| r.ok = false), "rank 1 has no workspace"),
        (verdict(&|r| r.host ^= 1), "rank 1 runs on another host"),
        (verdict(&|r| r.settings.max_bytes = 8_000_000), "up to 8000000 bytes on rank 1, 16000000 on rank 0"),
        (verdict(&|r| r.settings.strategy = 1), "EDGELLM_ALLREDUCE_STRATEGY is NCCL on rank 1, unset on rank 0"),
        (verdict(&|r| r.settings.strategy = Requested::Family(Family::Lamport).code()), "is LAMPORT on rank 1"),
        (verdict(&|r| r.settings.tables ^= 1), "other AUTO tables than rank 0 (another build of the library)"),
        (
            verdict(&|r| {
                r.settings.tuning = 0xabcd;
                r.settings.tables = tables_fingerprint(0xabcd);
            }),
            "their tuning files differ (tables 000000000000abcd on rank 1, none on rank 0; EDGELLM_ALLREDUCE_TUNING",
        ),
        (verdict(&|r| r.rank = 0), "rank 1 reports rank 0 of 2"),
        (verdict(&|r| r.nranks = 4), "rank 1 reports rank 1 of 4"),
        (verdict(&|r| r.max_blocks = 0), "grid cap of 0"),
        (verdict(&|r| r.max_blocks = EAR_MAX_BLOCKS + 1), "grid cap of 129"),
        (
            agree(&[round_trip(&record(0)), None], 2),
            "rank 1's record is not this build's (another kernel protocol than \"EARA\")",
        ),
        (agree(&[round_trip(&record(0))], 2), "1 records for 2 ranks"),
    ];
    for (v, says) in refused {
        let why = v.expect_err(says);
        assert!(why.contains(says), "{why:?} should say {says:?}");
    }
    // The same verdict on every rank: it depends on the records, not on who evaluates them.
    let records = [round_trip(&record(0)), round_trip(&Record { ok: false, ..record(1) })];
    assert_eq!(agree(&records, 2), agree(&records.clone(), 2));
}

#[test]
fn the_local_settings_name_every_knob_that_changes_the_path() {
    let s = Settings::local(2);
    assert_eq!(s.max_bytes, group::max_message_bytes(2));
    assert_eq!(s.tables, tables_fingerprint(s.tuning), "a pure function of the build and the tuning file");
    assert_eq!(s.tuning, 0, "no tuning file in the tests' environment");
    assert_eq!(tables_fingerprint(0), crate::launch::strategy::builtin_fingerprint());
    assert_ne!(tables_fingerprint(1), tables_fingerprint(0), "a tuning file changes the tables");
    assert_ne!(tables_fingerprint(1), tables_fingerprint(2));
    assert_ne!(s.tables, 0);
    assert_eq!(Settings { strategy: Requested::Auto.code(), ..s }.strategy_name(), "AUTO");
    for f in Family::ALL {
        let code = Requested::Family(f).code();
        assert_eq!(Requested::from_code(code), Some(Requested::Family(f)), "every family has its own code");
        assert_eq!(Settings { strategy: code, ..s }.strategy_name(), f.name().to_uppercase());
    }
    assert_eq!(Settings { strategy: 0, ..s }.strategy_name(), "unset");
}

#[test]
fn every_gather_fits_the_setup_scratch() {
    use crate::contract::EAR_MAX_RANKS;
    use crate::cuda::SETUP_SCRATCH_BYTES;
    for item in [RECORD_BYTES, 2, VERDICT_BYTES + 1] {
        assert!(item * (1 + EAR_MAX_RANKS) <= SETUP_SCRATCH_BYTES, "{item}-byte items of {EAR_MAX_RANKS} ranks");
    }
}

#[test]
fn a_rank_that_is_not_ready_is_named_with_its_reason() {
    assert_eq!(Standing::describe(Standing::GatherFailed as u8, 1), "rank 1's first gather failed there");
    assert_eq!(Standing::describe(Standing::MappingFailed as u8, 3), "rank 3 could not map every workspace");
    assert!(Standing::describe(Standing::Refused as u8, 2).starts_with("rank 2 refused the group"));
    assert_eq!(Standing::describe(0, 0), "rank 0 sent an unknown standing 0", "a zeroed entry is never ready");
    for s in [Standing::Ready, Standing::Refused, Standing::GatherFailed, Standing::MappingFailed] {
        assert_eq!(Standing::from_code(s as u8), Some(s));
    }
}
