use super::*;

struct Fake {
    nranks: i32,
    max_bytes: u64,
}
impl Fits for Fake {
    fn nranks(&self) -> i32 {
        self.nranks
    }
    fn serves(&self, family: Family, _: DataType, m: &Message) -> bool {
        m.bytes <= if family == Family::Lamport { self.max_bytes.min(2 << 20) } else { self.max_bytes }
    }
}
fn call(tp: i32, bytes: u64) -> Call {
    Call { tp_size: tp, dtype: DataType::Bf16, message: Message { bytes, rows: None }, aligned: true }
}
const GROUP2: Fake = Fake { nranks: 2, max_bytes: 16_000_000 };
const GROUP8: Fake = Fake { nranks: 8, max_bytes: 8_000_000 };

#[test]
fn one_rank_copies_whatever_is_requested() {
    for r in [Requested::Nccl, Requested::Family(Family::OneShot), Requested::Auto] {
        assert_eq!(choose(r, &call(1, 1024), None).path, Path::Copy);
    }
}

#[test]
fn auto_follows_the_table_then_nccl_above_the_workspace() {
    let at = |g: &Fake, b| choose(Requested::Auto, &call(g.nranks, b), Some(g)).path;
    assert_eq!(at(&GROUP2, 8 << 10), Path::Custom(Family::Lamport));
    assert_eq!(at(&GROUP2, 1 << 20), Path::Custom(Family::Lamport));
    assert_eq!(at(&GROUP2, (2 << 20) + 16), Path::Custom(Family::TwoShot));
    assert_eq!(at(&GROUP2, 8 << 20), Path::Custom(Family::TwoShot));
    assert_eq!(at(&GROUP2, 15 << 20), Path::Custom(Family::TwoShot));
    assert_eq!(at(&GROUP2, 64 << 20), Path::Nccl, "over the workspace");
    let huge = Fake { nranks: 2, max_bytes: 1 << 30 };
    assert_eq!(at(&huge, 32 << 20), Path::Custom(Family::TwoShot), "a large workspace keeps two-shot to 64 MiB");
    assert_eq!(at(&huge, 128 << 20), Path::Nccl, "NCCL above 64 MiB even when the workspace holds it");
    assert_eq!(at(&GROUP8, 32 << 10), Path::Custom(Family::Lamport));
    assert_eq!(at(&GROUP8, 128 << 10), Path::Custom(Family::OneShot));
    assert_eq!(at(&GROUP8, 4 << 20), Path::Custom(Family::TwoShot));
    let d = choose(Requested::Auto, &call(2, 128 << 20), Some(&Fake { nranks: 2, max_bytes: 1 << 30 }));
    assert_eq!((d.path, d.fallback), (Path::Nccl, None));
    let d = choose(Requested::Auto, &call(2, 64 << 20), Some(&GROUP2));
    assert_eq!(d.fallback, None, "NCCL above the workspace is AUTO's choice, not a fallback");
}

/// A group over links of a given class.
struct On<F: Fits>(F, LinkClass);
impl<F: Fits> Fits for On<F> {
    fn nranks(&self) -> i32 {
        self.0.nranks()
    }
    fn serves(&self, family: Family, dtype: DataType, m: &Message) -> bool {
        self.0.serves(family, dtype, m)
    }
    fn link_class(&self) -> LinkClass {
        self.1
    }
}
/// The same group with every rank on one device (simulated ranks).
#[allow(non_snake_case)]
fn OneDevice(g: Fake) -> On<Fake> {
    On(g, LinkClass::SameDevice)
}

#[test]
fn ranks_on_one_device_follow_the_table_measured_there() {
    let at = |n: i32, bytes: u64, one: bool| {
        let g = Fake { nranks: n, max_bytes: 64 << 20 };
        let c = call(n, bytes);
        if one {
            choose(Requested::Auto, &c, Some(&OneDevice(g))).path
        } else {
            choose(Requested::Auto, &c, Some(&g)).path
        }
    };
    let custom = Path::Custom;
    assert_eq!(at(2, 1 << 20, true), custom(Family::Lamport));
    assert_eq!(at(2, 4 << 20, true), custom(Family::OneShot));
    assert_eq!(at(2, 4 << 20, false), custom(Family::TwoShot), "separate GPUs: the links favour the two-shot");
    assert_eq!(at(4, 128 << 10, true), custom(Family::Lamport));
    assert_eq!(at(4, 256 << 10, true), custom(Family::OneShot), "in place, the one-shot from 256 KiB");
    assert_eq!(at(4, 8 << 20, true), custom(Family::OneShot));
    assert_eq!(at(4, 64 << 20, true), custom(Family::OneShot), "in place, the one-shot copies nothing");
    assert_eq!(at(4, 1 << 20, false), custom(Family::TwoShot));
    assert_eq!(at(4, 512 << 10, false), custom(Family::OneShot));
    assert_eq!(at(8, 64 << 10, true), custom(Family::Lamport));
    assert_eq!(at(8, 512 << 10, true), custom(Family::OneShot));
    assert_eq!(at(8, 1 << 20, true), custom(Family::TwoShot));
    assert_eq!(at(8, 64 << 20, true), custom(Family::TwoShot));
    assert_eq!(at(8, 64 << 20, false), Path::Nccl);
    let fused = |n: i32, tokens: u64, hidden: u32, one: bool| {
        let message = Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) };
        let c = Call { tp_size: n, dtype: DataType::Bf16, message, aligned: true };
        let g = Fake { nranks: n, max_bytes: 64 << 20 };
        if one {
            choose(Requested::Auto, &c, Some(&OneDevice(g))).path
        } else {
            choose(Requested::Auto, &c, Some(&g)).path
        }
    };
    // Rows of 4096 stay fused; wider rows split where the plain one-shot (in place) wins.
    assert_eq!(fused(4, 1024, 4096, true), custom(Family::OneShot));
    assert_eq!(fused(4, 512, 8192, true), Path::Split(Family::OneShot));
    assert_eq!(fused(4, 16, 8192, true), custom(Family::Lamport));
    assert_eq!(fused(8, 8, 4096, true), custom(Family::Lamport));
    assert_eq!(fused(8, 1, 8192, true), Path::Split(Family::Lamport));
    assert_eq!(fused(8, 128, 8192, true), Path::Split(Family::TwoShot));
    assert_eq!(fused(2, 128, 8192, true), custom(Family::OneShot));
    assert_eq!(fused(4, 512, 8192, false), Path::Split(Family::TwoShot), "separate GPUs: their own table");
}

#[test]
fn fused_calls_use_the_fused_table() {
    let fused = |tp, tokens: u64, hidden: u32| Call {
        tp_size: tp,
        dtype: DataType::Bf16,
        message: Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) },
        aligned: true,
    };
    assert_eq!(choose(Requested::Auto, &fused(2, 1, 4096), Some(&GROUP2)).path, Path::Custom(Family::Lamport));
    assert_eq!(choose(Requested::Auto, &fused(2, 8, 8192), Some(&GROUP2)).path, Path::Custom(Family::Lamport));
    assert_eq!(
        choose(Requested::Auto, &fused(2, 128, 8192), Some(&GROUP2)).path,
        Path::Custom(Family::Lamport),
        "2 MiB"
    );
    assert_eq!(choose(Requested::Auto, &fused(2, 256, 8192), Some(&GROUP2)).path, Path::Custom(Family::OneShot));
    assert_eq!(choose(Requested::Auto, &fused(2, 1024, 4096), Some(&GROUP2)).path, Path::Custom(Family::OneShot));
    assert_eq!(
        choose(Requested::Family(Family::OneShot), &fused(2, 128, 8192), Some(&GROUP2)).path,
        Path::Custom(Family::OneShot),
        "forced: fused"
    );
    assert_eq!(choose(Requested::Auto, &fused(8, 1, 4096), Some(&GROUP8)).path, Path::Custom(Family::Lamport));
    assert_eq!(choose(Requested::Auto, &fused(8, 1, 8192), Some(&GROUP8)).path, Path::Custom(Family::OneShot));
    assert_eq!(choose(Requested::Auto, &fused(8, 1024, 8192), Some(&GROUP8)).path, Path::Nccl, "16 MiB");
}

#[test]
fn auto_moves_to_a_larger_family_when_lamport_cannot_serve() {
    let tiny = Fake { nranks: 2, max_bytes: 64 << 10 };
    // The table says Lamport up to 2 MiB; this workspace holds 64 KB: no family can.
    assert_eq!(choose(Requested::Auto, &call(2, 128 << 10), Some(&tiny)).path, Path::Nccl);
    assert_eq!(choose(Requested::Auto, &call(2, 32 << 10), Some(&tiny)).path, Path::Custom(Family::Lamport));
}

#[test]
fn forced_strategies_run_or_fall_back_to_nccl_with_a_reason() {
    assert_eq!(
        choose(Requested::Family(Family::OneShot), &call(2, 8 << 20), Some(&GROUP2)).path,
        Path::Custom(Family::OneShot)
    );
    assert_eq!(
        choose(Requested::Family(Family::TwoShot), &call(2, 1024), Some(&GROUP2)).path,
        Path::Custom(Family::TwoShot)
    );
    assert_eq!(
        choose(Requested::Family(Family::Lamport), &call(2, 1024), Some(&GROUP2)).path,
        Path::Custom(Family::Lamport)
    );
    let cases = [
        (choose(Requested::Family(Family::OneShot), &call(2, 1024), None), Fallback::NoWorkspace),
        (choose(Requested::Family(Family::OneShot), &call(4, 1024), Some(&GROUP2)), Fallback::RankMismatch),
        (
            choose(Requested::Family(Family::TwoShot), &Call { aligned: false, ..call(2, 1024) }, Some(&GROUP2)),
            Fallback::Unaligned,
        ),
        (choose(Requested::Family(Family::OneShot), &call(2, 32 << 20), Some(&GROUP2)), Fallback::NotServed),
        (choose(Requested::Family(Family::Lamport), &call(2, 4 << 20), Some(&GROUP2)), Fallback::NotServed),
    ];
    for (decision, reason) in cases {
        assert_eq!(decision.path, Path::Nccl);
        assert_eq!(decision.fallback, Some(reason));
    }
    assert_eq!(choose(Requested::Nccl, &call(2, 1024), Some(&GROUP2)).path, Path::Nccl);
}

/// A group whose kernels take only `families` (any size).
struct Only(i32, &'static [Family]);
impl Fits for Only {
    fn nranks(&self) -> i32 {
        self.0
    }
    fn serves(&self, family: Family, _: DataType, _: &Message) -> bool {
        self.1.contains(&family)
    }
}

fn fused_call(tp: i32, tokens: u64, hidden: u32) -> Call {
    Call {
        tp_size: tp,
        dtype: DataType::Bf16,
        message: Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) },
        aligned: true,
    }
}

#[test]
fn over_pcie_auto_reads_from_peers_and_leaves_large_messages_to_nccl() {
    // The bounds of PCIE_AUTO_TABLE's model: pushes of (N-1) x S <= 16 KiB per rank, NCCL
    // above 1 MiB.
    let lamport_ok = |n: i32, bytes: u64| (n as u64 - 1) * bytes <= 16 << 10;
    // The table's bound: the largest power of two within it.
    let lamport_bound = |n: i32| 1u64 << (((16u64 << 10) / (n as u64 - 1)).ilog2());
    let mut sizes: Vec<u64> = (4..=28).map(|p| 1u64 << p).collect();
    sizes.extend((4..=28).map(|p| (1u64 << p) + 16));
    for n in crate::launch::family::RANK_COUNTS {
        let g = On(Fake { nranks: n, max_bytes: 64 << 20 }, LinkClass::Pcie);
        for &bytes in &sizes {
            let plain = choose(Requested::Auto, &call(n, bytes), Some(&g)).path;
            match plain {
                Path::Custom(Family::Lamport) => assert!(lamport_ok(n, bytes), "{n} ranks, {bytes} B: Lamport"),
                Path::Custom(Family::TwoShot) => assert!(n > 2, "{n} ranks, {bytes} B: the 2-rank two-shot pushes"),
                Path::Custom(Family::OneShot) => {}
                Path::Nccl => assert!(bytes > 1 << 20, "{n} ranks, {bytes} B: NCCL"),
                p => panic!("{p:?}"),
            }
            if bytes > 1 << 20 {
                assert_eq!(plain, Path::Nccl, "{n} ranks, {bytes} B");
            }
            if bytes <= lamport_bound(n) {
                assert_eq!(plain, Path::Custom(Family::Lamport), "{n} ranks, {bytes} B: latency-bound");
            }
        }
        for hidden in [2048u32, 4096, 8192] {
            for tokens in (0..=12).map(|p| 1u64 << p) {
                let c = fused_call(n, tokens, hidden);
                let bytes = c.message.bytes;
                match choose(Requested::Auto, &c, Some(&g)).path {
                    Path::Custom(Family::Lamport) | Path::Split(Family::Lamport) => {
                        assert!(lamport_ok(n, bytes), "{n} ranks, {tokens}x{hidden}")
                    }
                    Path::Custom(Family::TwoShot) => panic!("{n} ranks, {tokens}x{hidden}: the fused two-shot pushes"),
                    Path::Split(Family::TwoShot) => assert!(n > 2, "{n} ranks, {tokens}x{hidden}"),
                    Path::Nccl => assert!(bytes > 1 << 20, "{n} ranks, {tokens}x{hidden}: NCCL"),
                    _ => assert!(bytes <= 1 << 20),
                }
            }
        }
    }
    // The model's crossovers.
    let at = |n: i32, bytes: u64| {
        choose(Requested::Auto, &call(n, bytes), Some(&On(Fake { nranks: n, max_bytes: 64 << 20 }, LinkClass::Pcie)))
            .path
    };
    assert_eq!(at(2, 16 << 10), Path::Custom(Family::Lamport), "one decode row of 8192 bf16");
    assert_eq!(at(2, 32 << 10), Path::Custom(Family::OneShot));
    assert_eq!(at(2, 1 << 20), Path::Custom(Family::OneShot));
    assert_eq!(at(4, 64 << 10), Path::Custom(Family::OneShot));
    assert_eq!(at(4, 128 << 10), Path::Custom(Family::TwoShot), "the pulling two-shot at 4 ranks");
    assert_eq!(at(6, 2 << 10), Path::Custom(Family::Lamport), "6 ranks: the 8-rank row");
    assert_eq!(at(16, 2 << 10), Path::Custom(Family::OneShot));
    assert_eq!(at(8, 2 << 20), Path::Nccl);
}

#[test]
fn over_pcie_the_fallback_never_moves_to_a_family_that_pushes() {
    // The table says one-shot; a group that cannot run it moves on to the two-shot over
    // NVLink, but over PCIe only where the two-shot pulls (4+ ranks, plain).
    let no_oneshot: &[Family] = &[Family::TwoShot, Family::Lamport];
    let path = |n: i32, c: &Call, class| choose(Requested::Auto, c, Some(&On(Only(n, no_oneshot), class))).path;
    assert_eq!(path(2, &call(2, 64 << 10), LinkClass::Pcie), Path::Nccl);
    assert_eq!(path(2, &call(2, 3 << 20), LinkClass::NvLink), Path::Custom(Family::TwoShot), "NVLink: unchanged");
    assert_eq!(
        path(4, &call(4, 32 << 10), LinkClass::Pcie),
        Path::Custom(Family::TwoShot),
        "4 ranks: the two-shot pulls"
    );
    assert_eq!(path(4, &fused_call(4, 4, 4096), LinkClass::Pcie), Path::Nccl, "the fused two-shot pushes");
    assert_eq!(
        path(4, &fused_call(4, 64, 4096), LinkClass::NvLink),
        Path::Custom(Family::TwoShot),
        "NVLink: the fused one-shot's fallback"
    );
    // A forced strategy is the user's to choose.
    assert_eq!(
        choose(Requested::Family(Family::TwoShot), &call(2, 64 << 10), Some(&On(Only(2, no_oneshot), LinkClass::Pcie)))
            .path,
        Path::Custom(Family::TwoShot)
    );
    assert_eq!(
        choose(Requested::Family(Family::Lamport), &call(2, 1 << 20), Some(&On(GROUP2, LinkClass::Pcie))).path,
        Path::Custom(Family::Lamport)
    );
}

#[test]
fn without_peer_access_every_call_uses_nccl() {
    let g = On(Fake { nranks: 2, max_bytes: 64 << 20 }, LinkClass::NoPeer);
    for r in [
        Requested::Auto,
        Requested::Family(Family::OneShot),
        Requested::Family(Family::TwoShot),
        Requested::Family(Family::Lamport),
    ] {
        for bytes in [1024, 1 << 20, 64 << 20] {
            let d = choose(r, &call(2, bytes), Some(&g));
            assert_eq!((d.path, d.fallback), (Path::Nccl, Some(Fallback::NoWorkspace)), "{r:?} {bytes}");
        }
        assert_eq!(choose(r, &fused_call(2, 1, 4096), Some(&g)).path, Path::Nccl);
    }
    assert!(builtin_tables(LinkClass::NoPeer).is_none());
    assert_eq!(choose(Requested::Nccl, &call(1, 1024), Some(&g)).path, Path::Copy, "one rank still copies");
}

#[test]
fn tuned_tables_serve_the_links_they_were_measured_on() {
    let machine = crate::launch::tuning::Machine {
        host: "h".into(),
        driver: "d".into(),
        gpus: vec![crate::launch::tuning::Gpu { bus_id: "0000:01:00.0".into(), name: "GPU".into() }],
    };
    let text = |links: &str| {
        format!(
            "edgellm-allreduce tuning v1\nmachine: {}\ndriver: {}\ngpu: 0000:01:00.0 GPU\nlinks: {links}\nlibrary: {}\n\
             plain ranks=2 dtype=any upto=4096 oneshot\nplain ranks=2 dtype=any upto=max twoshot\n\
             fused ranks=2 dtype=bf16 rows=any upto=max split:oneshot\nend rows=3\n",
            machine.host,
            machine.driver,
            crate::launch::tuning::library_id()
        )
    };
    let pcie = Tuning::parse(&text("pcie")).unwrap();
    pcie.check(&machine).unwrap();
    let g = |class| On(Fake { nranks: 2, max_bytes: 64 << 20 }, class);
    let auto = |c: &Call, class, t: Option<&Tuning>| choose_tuned(Requested::Auto, c, Some(&g(class)), t).path;
    assert_eq!(
        auto(&call(2, 1 << 20), LinkClass::Pcie, Some(&pcie)),
        Path::Custom(Family::TwoShot),
        "the file's choice, a push family included"
    );
    assert_eq!(auto(&call(2, 4096), LinkClass::Pcie, Some(&pcie)), Path::Custom(Family::OneShot));
    assert_eq!(auto(&call(2, 1 << 20), LinkClass::Pcie, None), Path::Custom(Family::OneShot), "built-in PCIe table");
    assert_eq!(
        auto(&call(2, 1 << 20), LinkClass::NvLink, Some(&pcie)),
        Path::Custom(Family::Lamport),
        "NVLink group: built-in"
    );
    assert_eq!(auto(&fused_call(2, 8, 8192), LinkClass::Pcie, Some(&pcie)), Path::Split(Family::OneShot));
    assert_eq!(
        choose_tuned(
            Requested::Auto,
            &Call { dtype: DataType::Half, ..fused_call(2, 8, 8192) },
            Some(&g(LinkClass::Pcie)),
            Some(&pcie)
        )
        .path,
        Path::Custom(Family::OneShot),
        "fp16 fused: no section, the built-in PCIe table"
    );
    let four = On(Fake { nranks: 4, max_bytes: 64 << 20 }, LinkClass::Pcie);
    assert_eq!(
        choose_tuned(Requested::Auto, &call(4, 128 << 10), Some(&four), Some(&pcie)).path,
        Path::Custom(Family::TwoShot),
        "4 ranks: built-in"
    );
    assert_eq!(
        choose_tuned(Requested::Family(Family::OneShot), &call(2, 1 << 20), Some(&g(LinkClass::Pcie)), Some(&pcie))
            .path,
        Path::Custom(Family::OneShot),
        "forced: the file is AUTO's"
    );
    let same = Tuning::parse(&text("same-device")).unwrap();
    assert_eq!(auto(&call(2, 1 << 20), LinkClass::SameDevice, Some(&same)), Path::Custom(Family::TwoShot));
    assert_eq!(auto(&call(2, 1 << 20), LinkClass::Pcie, Some(&same)), Path::Custom(Family::OneShot));
}

#[test]
fn the_fingerprint_covers_every_built_in_table() {
    let text = builtin_text();
    for table in [AUTO_TABLE, ONE_DEVICE_AUTO_TABLE, PCIE_AUTO_TABLE] {
        assert!(text.contains(&format!("{table:?}")), "{table:?}");
    }
    for table in
        [FUSED_AUTO_TABLE, ONE_DEVICE_FUSED_AUTO_TABLE, ONE_DEVICE_FUSED_AUTO_TABLE_WIDE, PCIE_FUSED_AUTO_TABLE]
    {
        assert!(text.contains(&format!("{table:?}")), "{table:?}");
    }
    assert!(text.contains(&format!("{GRID_CAPS:?}")), "the grid caps");
    assert_eq!(builtin_fingerprint(), crate::fingerprint::fnv1a(text.as_bytes()));
    // Every built-in table is well formed: increasing bounds, an unbounded last entry, a
    // row for the largest rank count.
    for class in LinkClass::ALL {
        let Some(t) = builtin_tables(class) else { continue };
        let check = |rows: Vec<(i32, Vec<u64>)>| {
            assert!(rows.last().is_some_and(|(n, _)| *n >= 16), "{class:?}");
            for (n, bounds) in rows {
                assert!(bounds.windows(2).all(|w| w[0] < w[1]) && bounds.last() == Some(&u64::MAX), "{class:?} {n}");
            }
        };
        check(t.plain.iter().map(|(n, r)| (*n, r.iter().map(|e| e.0).collect())).collect());
        check(t.fused.iter().map(|(n, r)| (*n, r.iter().map(|e| e.0).collect())).collect());
        check(t.fused_wide.iter().map(|(n, r)| (*n, r.iter().map(|e| e.0).collect())).collect());
    }
}
