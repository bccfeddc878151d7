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
    assert_eq!(at(2, 512 << 10, true), custom(Family::Lamport));
    assert_eq!(at(2, 768 << 10, true), custom(Family::OneShot), "2 ranks in place: the one-shot from 768 KiB");
    assert_eq!(at(2, 4 << 20, true), custom(Family::OneShot));
    assert_eq!(at(2, 4 << 20, false), custom(Family::TwoShot), "separate GPUs: the links favour the two-shot");
    assert_eq!(at(4, 128 << 10, true), custom(Family::Lamport));
    assert_eq!(at(4, 256 << 10, true), custom(Family::OneShot), "in place, the one-shot from 256 KiB");
    assert_eq!(at(4, 8 << 20, true), custom(Family::OneShot));
    assert_eq!(at(4, 64 << 20, true), custom(Family::OneShot), "in place, the one-shot copies nothing");
    assert_eq!(at(4, 1 << 20, false), custom(Family::TwoShot));
    assert_eq!(at(4, 512 << 10, false), custom(Family::OneShot));
    assert_eq!(at(8, 48 << 10, true), custom(Family::Lamport));
    assert_eq!(at(8, 64 << 10, true), custom(Family::OneShot), "8 ranks: the one-shot from 64 KiB (H100)");
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
fn over_pcie_auto_pushes_or_uses_nccl_and_never_pulls() {
    // PCIE_AUTO_TABLE's model: the staged push up to 1 MiB at 2 ranks, 256 KiB at 4, 64 KiB at
    // 6 and 8, never at 16; NCCL above; a pulling family never, whatever the size.
    let bound = |n: i32| match n {
        2 => 1 << 20,
        4 => 256 << 10,
        6 | 8 => 64 << 10,
        _ => 0,
    };
    let mut sizes: Vec<u64> = (4..=28).map(|p| 1u64 << p).collect();
    sizes.extend((4..=28).map(|p| (1u64 << p) + 16));
    for n in crate::launch::family::RANK_COUNTS {
        let g = On(Fake { nranks: n, max_bytes: 64 << 20 }, LinkClass::Pcie);
        for &bytes in &sizes {
            let want = if bytes <= bound(n) { Path::Custom(Family::Push) } else { Path::Nccl };
            assert_eq!(choose(Requested::Auto, &call(n, bytes), Some(&g)).path, want, "{n} ranks, {bytes} B");
        }
        for hidden in [2048u32, 4096, 8192] {
            for tokens in (0..=12).map(|p| 1u64 << p) {
                let c = fused_call(n, tokens, hidden);
                let want = if c.message.bytes <= bound(n) { Path::Custom(Family::Push) } else { Path::Nccl };
                assert_eq!(choose(Requested::Auto, &c, Some(&g)).path, want, "{n} ranks, {tokens}x{hidden}");
            }
        }
    }
    // The built-in PCIe tables name no family that loads from its peers, at any rank count.
    let tables = builtin_tables(LinkClass::Pcie).unwrap();
    for &(n, rows) in tables.plain {
        for &(_, f) in rows {
            assert!(f.is_none_or(|f| f.writes_into_peers(Op::AllReduce, n)), "{n} ranks: {f:?} pulls");
        }
    }
    for &(n, rows) in tables.fused.iter().chain(tables.fused_wide) {
        for &(_, way) in rows {
            let pushes = match way {
                FusedChoice::Nccl => true,
                FusedChoice::Fused(f) => f.writes_into_peers(Op::ResidualRmsNorm, n),
                FusedChoice::Split(f) => f.writes_into_peers(Op::AllReduce, n),
            };
            assert!(pushes, "{n} ranks: {way:?} pulls");
        }
    }
    assert_eq!(builtin_grid_cap(LinkClass::Pcie, Family::Push, 2), Some(16));
    assert_eq!(builtin_grid_cap(LinkClass::Pcie, Family::Push, 8), Some(4));
    assert_eq!(builtin_grid_cap(LinkClass::NvLink, Family::Push, 2), None, "only over PCIe");
}

/// A PCIe group on which no pulling family may run (`pulls_enabled` false).
struct NoPulls(Fake);
impl Fits for NoPulls {
    fn nranks(&self) -> i32 {
        self.0.nranks
    }
    fn serves(&self, family: Family, dtype: DataType, m: &Message) -> bool {
        self.0.serves(family, dtype, m)
    }
    fn link_class(&self) -> LinkClass {
        LinkClass::Pcie
    }
    fn pulls(&self) -> bool {
        false
    }
}

#[test]
fn a_pulling_family_runs_only_where_the_group_allows_it() {
    let g = NoPulls(Fake { nranks: 4, max_bytes: 64 << 20 });
    let d = choose(Requested::Family(Family::OneShot), &call(4, 64 << 10), Some(&g));
    assert_eq!((d.path, d.fallback), (Path::Nccl, Some(Fallback::NoPeerReads)), "forced, but it pulls");
    assert!(Fallback::NoPeerReads.describe().contains("loads from its peers"));
    let two = NoPulls(Fake { nranks: 2, max_bytes: 64 << 20 });
    let d = choose(Requested::Family(Family::TwoShot), &call(2, 64 << 10), Some(&two));
    assert_eq!(d.path, Path::Custom(Family::TwoShot), "the 2-rank two-shot pushes");
    assert_eq!(choose(Requested::Family(Family::Push), &call(4, 64 << 10), Some(&g)).path, Path::Custom(Family::Push));
    // Over PCIe AUTO takes its table's choice or NCCL, never another family.
    let only_oneshot = On(Only(4, &[Family::OneShot]), LinkClass::Pcie);
    assert_eq!(choose(Requested::Auto, &call(4, 64 << 10), Some(&only_oneshot)).path, Path::Nccl);
    // Where pulls are allowed (NVLink; PCIe with a tuning file that chose one), they run.
    let nvlink = On(Fake { nranks: 4, max_bytes: 64 << 20 }, LinkClass::NvLink);
    let d = choose(Requested::Family(Family::OneShot), &call(4, 64 << 10), Some(&nvlink));
    assert_eq!(d.path, Path::Custom(Family::OneShot));
    assert!(pulls_enabled(LinkClass::NvLink, 4, None) && pulls_enabled(LinkClass::SameDevice, 8, None));
    assert!(!pulls_enabled(LinkClass::Pcie, 2, None), "the built-in PCIe tables never pull");
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
    assert_eq!(auto(&call(2, 1 << 20), LinkClass::Pcie, None), Path::Custom(Family::Push), "built-in PCIe table");
    assert!(pulls_enabled(LinkClass::Pcie, 2, Some(&pcie)), "the file chose a pulling family at 2 ranks");
    assert!(!pulls_enabled(LinkClass::Pcie, 4, Some(&pcie)), "not at 4");
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
        Path::Custom(Family::Push),
        "fp16 fused: no section, the built-in PCIe table"
    );
    let four = On(Fake { nranks: 4, max_bytes: 64 << 20 }, LinkClass::Pcie);
    assert_eq!(
        choose_tuned(Requested::Auto, &call(4, 128 << 10), Some(&four), Some(&pcie)).path,
        Path::Custom(Family::Push),
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
    assert_eq!(auto(&call(2, 1 << 20), LinkClass::Pcie, Some(&same)), Path::Custom(Family::Push), "built-in");
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

#[test]
fn strategy_names_parse_in_any_case() {
    for (text, want) in [
        (" nccl ", Some(Requested::Nccl)),
        ("Auto", Some(Requested::Auto)),
        ("ONESHOT", Some(Requested::Family(Family::OneShot))),
        ("push", Some(Requested::Family(Family::Push))),
        ("lamportx", None),
        ("", None),
    ] {
        assert_eq!(Requested::from_name(text), want, "{text:?}");
    }
}
