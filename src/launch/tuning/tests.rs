use super::*;

mod refused;

fn machine() -> Machine {
    Machine {
        host: "gpu-node-7".into(),
        driver: "580.82.09 (CUDA 13.0)".into(),
        gpus: vec![
            Gpu { bus_id: "0000:17:00.0".into(), name: "NVIDIA H200".into() },
            Gpu { bus_id: "0000:3d:00.0".into(), name: "NVIDIA H200".into() },
        ],
    }
}

fn key(op: TunedOp, nranks: i32, dtype: Option<DataType>, width: Option<RowWidth>) -> SectionKey {
    SectionKey { op, nranks, dtype, width }
}

fn sample() -> Tuning {
    use FusedChoice::*;
    Tuning {
        machine: machine(),
        links: LinkClass::Pcie,
        library: library_id(),
        grids: vec![GridCap { nranks: 2, family: Family::Lamport, ctas: 16 }],
        sections: vec![
            Section {
                key: key(TunedOp::Plain, 2, None, None),
                rows: vec![(32 << 10, Fused(Family::Lamport)), (4 << 20, Fused(Family::OneShot)), (u64::MAX, Nccl)],
            },
            Section {
                key: key(TunedOp::Plain, 2, Some(DataType::Float), None),
                rows: vec![(8 << 10, Fused(Family::Lamport)), (u64::MAX, Fused(Family::TwoShot))],
            },
            Section {
                key: key(TunedOp::Fused, 2, Some(DataType::Bf16), Some(RowWidth::Wide)),
                rows: vec![(16 << 10, Fused(Family::Lamport)), (1 << 20, Split(Family::OneShot)), (u64::MAX, Nccl)],
            },
            Section {
                key: key(TunedOp::Fused, 2, None, Some(RowWidth::Any)),
                rows: vec![(u64::MAX, Fused(Family::OneShot))],
            },
            Section { key: key(TunedOp::Plain, 4, None, None), rows: vec![(u64::MAX, Nccl)] },
        ],
    }
}

#[test]
fn round_trip() {
    let t = sample();
    t.validate().unwrap();
    let text = t.to_text();
    assert!(text.starts_with("edgellm-allreduce tuning v1\nmachine: gpu-node-7\n"), "{text}");
    assert!(text.contains("\nplain ranks=2 dtype=any upto=32768 lamport\n"), "{text}");
    assert!(text.contains("\nfused ranks=2 dtype=bf16 rows=wide upto=1048576 split:oneshot\n"), "{text}");
    assert!(text.ends_with("plain ranks=4 dtype=any upto=max nccl\nend rows=10 grids=1\n"), "{text}");
    let back = Tuning::parse(&text).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.to_text(), text);
    assert_eq!(back.fingerprint(), t.fingerprint());
    // Comments, blank lines, indentation and spelled-out sizes change nothing AUTO reads.
    let decorated =
        format!("# measured by hand\n\n{}", text.replace("upto=32768", "upto=32K").replace("\nplain", "\n  plain"));
    let back = Tuning::parse(&decorated).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.fingerprint(), t.fingerprint());
    back.check(&machine()).unwrap();
}

#[test]
fn fingerprints_follow_the_tables_not_the_header() {
    let t = sample();
    let mut other_host = t.clone();
    other_host.machine.host = "elsewhere".into();
    assert_eq!(other_host.fingerprint(), t.fingerprint());
    let mut other_row = t.clone();
    other_row.sections[0].rows[0].0 = 16 << 10;
    assert_ne!(other_row.fingerprint(), t.fingerprint());
    let mut other_links = t.clone();
    other_links.links = LinkClass::NvLink;
    assert_ne!(other_links.fingerprint(), t.fingerprint());
    assert_ne!(t.fingerprint(), 0);
}

#[test]
fn lookups_prefer_the_dtype_then_the_width_and_only_on_their_links() {
    let t = sample();
    let plain = |bytes| Message { bytes, rows: None };
    let fused = |tokens: u64, hidden: u32| Message { bytes: tokens * hidden as u64 * 2, rows: Some((tokens, hidden)) };
    use FusedChoice::*;
    let pcie = LinkClass::Pcie;
    assert_eq!(t.choice(pcie, 2, DataType::Bf16, &plain(32 << 10)), Some(Fused(Family::Lamport)));
    assert_eq!(t.choice(pcie, 2, DataType::Bf16, &plain((32 << 10) + 16)), Some(Fused(Family::OneShot)));
    assert_eq!(t.choice(pcie, 2, DataType::Bf16, &plain(64 << 20)), Some(Nccl));
    assert_eq!(
        t.choice(pcie, 2, DataType::Float, &plain(16 << 10)),
        Some(Fused(Family::TwoShot)),
        "fp32's own section"
    );
    assert_eq!(t.choice(pcie, 4, DataType::Half, &plain(1024)), Some(Nccl));
    assert_eq!(t.choice(pcie, 8, DataType::Half, &plain(1024)), None, "no section: the built-in table");
    assert_eq!(t.choice(LinkClass::NvLink, 2, DataType::Bf16, &plain(1024)), None, "measured on PCIe only");
    assert_eq!(t.choice(pcie, 2, DataType::Bf16, &fused(1, 8192)), Some(Fused(Family::Lamport)));
    assert_eq!(t.choice(pcie, 2, DataType::Bf16, &fused(32, 8192)), Some(Split(Family::OneShot)));
    assert_eq!(
        t.choice(pcie, 2, DataType::Bf16, &fused(32, 4096)),
        Some(Fused(Family::OneShot)),
        "narrow rows: rows=any"
    );
    assert_eq!(t.choice(pcie, 2, DataType::Half, &fused(32, 8192)), Some(Fused(Family::OneShot)), "fp16: dtype=any");
    assert_eq!(t.choice(pcie, 4, DataType::Half, &fused(32, 8192)), None, "no fused section at 4 ranks");
}

/// Parses `text`, expecting a refusal of `kind` whose message says `says`.
#[test]
fn other_machines_and_builds_are_refused_naming_the_difference() {
    let t = sample();
    t.check(&machine()).unwrap();
    let fewer = Machine { gpus: machine().gpus[1..].to_vec(), ..machine() };
    t.check(&fewer).expect("a process that sees fewer GPUs (CUDA_VISIBLE_DEVICES) is the same machine");
    let foreign = |m: Machine, says: &str| {
        let e = t.check(&m).expect_err(says);
        assert_eq!(e.kind, TuningErrorKind::Foreign);
        assert!(e.message.contains(says), "{e} should say {says:?}");
    };
    foreign(Machine { host: "other".into(), ..machine() }, "measured on host 'gpu-node-7', this is 'other'");
    foreign(
        Machine { driver: "590.1 (CUDA 13.1)".into(), ..machine() },
        "measured with driver 580.82.09 (CUDA 13.0), this machine has 590.1 (CUDA 13.1)",
    );
    let mut swapped = machine();
    swapped.gpus[0].name = "NVIDIA H100".into();
    foreign(swapped, "the GPU at 0000:17:00.0 is an NVIDIA H100 here, an NVIDIA H200 in the file");
    let mut more = machine();
    more.gpus.push(Gpu { bus_id: "0000:9a:00.0".into(), name: "NVIDIA H200".into() });
    foreign(more, "GPU 0000:9a:00.0 (NVIDIA H200) is not among the file's GPUs");
    let both = Machine { host: "other".into(), driver: "x".into(), ..machine() };
    let e = t.check(&both).unwrap_err();
    assert!(e.message.contains("host") && e.message.contains("driver"), "every difference named: {e}");
    let old = Tuning { library: "0.0.9 EAR7".into(), ..sample() };
    let e = old.check(&machine()).unwrap_err();
    assert_eq!(e.kind, TuningErrorKind::Library);
    assert!(e.message.contains(&format!("measured with library 0.0.9 EAR7, this is {}", library_id())), "{e}");
}

#[test]
fn the_loader_reports_and_falls_back() {
    let dir = std::env::temp_dir().join(format!("ear-tuning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(FILE_NAME);
    let here = || Ok(machine());
    // The default place, no file: nothing to say.
    let _ = std::fs::remove_file(&path);
    assert_eq!(load(&path, false, here), Ok(None));
    // Named by the environment but missing: a warning.
    let e = load(&path, true, here).unwrap_err();
    assert_eq!(e.kind, TuningErrorKind::Io);
    assert!(e.message.contains("cannot read it"), "{e}");
    std::fs::write(&path, sample().to_text()).unwrap();
    assert_eq!(load(&path, false, here), Ok(Some(sample())));
    let e = load(&path, false, || Err("no driver".to_owned())).unwrap_err();
    assert!(e.message.contains("cannot tell which machine this is (no driver)"), "{e}");
    let e = load(&path, false, || Ok(Machine { host: "x".into(), ..machine() })).unwrap_err();
    assert_eq!(e.kind, TuningErrorKind::Foreign);
    std::fs::write(&path, &sample().to_text()[..200]).unwrap();
    assert!(load(&path, false, here).is_err());
    std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
    assert!(load(&path, false, here).unwrap_err().message.contains("not UTF-8"));
    std::fs::write(&path, vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).unwrap();
    assert!(load(&path, false, here).unwrap_err().message.contains("larger than any tuning file"));
    assert!(load(&dir, true, here).is_err(), "a directory");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn small_pieces() {
    assert_eq!(
        driver_description(
            13000,
            Some("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.09  Wed Aug 20 2025\nGCC version: gcc 12\n")
        ),
        "580.82.09 (CUDA 13.0)"
    );
    assert_eq!(
        driver_description(
            12080,
            Some("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build\n")
        ),
        "570.124.06 (CUDA 12.8)"
    );
    assert_eq!(driver_description(13010, None), "CUDA 13.1");
    assert_eq!(driver_description(13000, Some("garbage")), "CUDA 13.0");
    assert_eq!(one_line(" a\nb\t "), "a b");
    assert_eq!(parse_bound("2M"), Some(2 << 20));
    assert_eq!(parse_bound("max"), Some(u64::MAX));
    assert_eq!(parse_bound("M"), None);
    assert_eq!(parse_bound("1.5M"), None);
    assert_eq!(RowWidth::of(NARROW_ROW), RowWidth::Narrow);
    assert_eq!(RowWidth::of(NARROW_ROW + 1), RowWidth::Wide);
    assert!(library_id().starts_with(env!("CARGO_PKG_VERSION")) && library_id().contains(" EAR"), "{}", library_id());
    let empty = Tuning { sections: Vec::new(), ..sample() };
    assert!(empty.validate().unwrap_err().message.contains("no table rows"));
    let mut split_plain = sample();
    split_plain.sections[0].rows[0].1 = FusedChoice::Split(Family::OneShot);
    assert!(split_plain.validate().unwrap_err().message.contains("only the fused op splits"));
    let mut keyless = sample();
    keyless.sections[0].key.width = Some(RowWidth::Any);
    assert!(keyless.validate().unwrap_err().message.contains("a fused section has a rows= class"));
}

#[test]
fn grid_lines_round_trip_and_files_without_them_still_load() {
    let t = sample();
    let text = t.to_text();
    assert!(text.contains("\ngrid ranks=2 lamport ctas=16\n"), "{text}");
    assert_eq!(Tuning::parse(&text), Ok(t.clone()));
    assert_eq!(t.grid(LinkClass::Pcie, 2, Family::Lamport), Some(16));
    assert_eq!(t.grid(LinkClass::Pcie, 4, Family::Lamport), None, "no line for 4 ranks");
    assert_eq!(t.grid(LinkClass::NvLink, 2, Family::Lamport), None, "measured on other links");
    // An older tune's file: no grid line, the same tables otherwise.
    let older = text.replace("grid ranks=2 lamport ctas=16\n", "").replace(" grids=1", "");
    assert_eq!(Tuning::parse(&older), Ok(Tuning { grids: Vec::new(), ..t.clone() }));
    assert_ne!(Tuning { grids: Vec::new(), ..t.clone() }.fingerprint(), t.fingerprint(), "grids are tables too");
    for (bad, says) in [
        ("grid ranks=2 lamport ctas=0", "ctas=<1..128>"),
        ("grid ranks=2 lamport ctas=129", "ctas=<1..128>"),
        ("grid ranks=2 fast ctas=8", "not a family"),
        ("grid ranks=3 lamport ctas=8", "a rank count of"),
        ("grid ranks=2 lamport", "expected 'grid ranks="),
    ] {
        let e = Tuning::parse(&text.replace("grid ranks=2 lamport ctas=16", bad)).unwrap_err();
        assert!(e.message.contains(says), "{bad}: {e}");
    }
    let twice =
        text.replace("grid ranks=2 lamport ctas=16\n", "grid ranks=2 lamport ctas=16\ngrid ranks=2 lamport ctas=8\n");
    assert!(Tuning::parse(&twice).unwrap_err().message.contains("each family once"));
}
