//! A tuning file on a GPU, as a user's process meets it: written for this machine (as
//! `edgellm-allreduce-bench tune` writes one), named by `EDGELLM_ALLREDUCE_TUNING` before the
//! library reads its settings, loaded once, and then AUTO's choice for a group over the links it
//! was measured on (here simulated ranks on GPU 0: `same-device`) is the file's, where it differs
//! from the built-in tables; rank counts the file has no section for keep the built-in choice.
//! (Ranks with different files use NCCL: the exchange's agreement, tested on CPU and across
//! processes by tests/cpp/multiprocess_one_gpu_test.cpp.)
//!
//! The library reads its settings when it is loaded (before `main`: its static registration), so
//! the test writes the file, then runs itself again with `EDGELLM_ALLREDUCE_TUNING` naming it,
//! as a user's process starts. Needs a GPU, so the test is `#[ignore]`d:
//! tools/gpu/contract_check.sh runs the binary with `--ignored`.

use edgellm_allreduce::tuning::{self, Machine, Section, SectionKey, TunedOp, Tuning};
use edgellm_allreduce::{
    builtin_tables, choose, Call, DataType, Family, FusedChoice, Group, LinkClass, Message, Path, Requested,
};

mod common;
use common::gpu;

/// A plain all-reduce call of `bytes` bf16 bytes on `nranks` ranks.
fn plain(nranks: i32, bytes: u64) -> Call {
    Call { tp_size: nranks, dtype: DataType::Bf16, message: Message { bytes, rows: None }, aligned: true }
}

/// What the built-in tables choose for the plain op of `nranks` ranks and `bytes` on one device.
fn builtin(nranks: i32, bytes: u64) -> Option<Family> {
    let tables = builtin_tables(LinkClass::SameDevice).expect("one device has tables");
    let (_, rows) = tables.plain.iter().find(|(n, _)| *n == nranks).expect("a row for the rank count");
    rows.iter().find(|(upto, _)| bytes <= *upto).and_then(|(_, f)| *f)
}

/// Set in the process that loads the file (the test run again by itself).
const CHILD: &str = "EDGELLM_TEST_TUNING_CHILD";
const SMALL: u64 = 8 << 10;
const LARGE: u64 = 4 << 20;

/// The file's 2-rank choice up to 64 KiB: a family the built-in table does not take at SMALL.
fn ours() -> Family {
    if builtin(2, SMALL) == Some(Family::TwoShot) {
        Family::OneShot
    } else {
        Family::TwoShot
    }
}

#[test]
#[ignore = "needs a GPU: tools/gpu/contract_check.sh"]
fn a_group_uses_the_tuning_file_it_loaded() {
    let _ctx = gpu();
    if std::env::var_os(CHILD).is_some() {
        return loads_and_uses_it();
    }
    let machine = Machine::current().expect("this machine as the library sees it");
    let file = Tuning {
        machine,
        links: LinkClass::SameDevice,
        library: tuning::library_id(),
        grids: Vec::new(),
        sections: vec![Section {
            key: SectionKey { op: TunedOp::Plain, nranks: 2, dtype: None, width: None },
            rows: vec![(64 << 10, FusedChoice::Fused(ours())), (u64::MAX, FusedChoice::Nccl)],
        }],
    };
    file.validate().expect("a valid file");
    let path = std::env::temp_dir().join(format!("edgellm-allreduce-tuning-{}.txt", std::process::id()));
    std::fs::write(&path, file.to_text()).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "a_group_uses_the_tuning_file_it_loaded", "--nocapture"])
        .env(CHILD, "1")
        .env("EDGELLM_ALLREDUCE_TUNING", &path)
        .output()
        .expect("the test runs itself");
    std::fs::remove_file(&path).ok();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the process that loaded the file failed: {}", out.status);
}

/// In the process started with `EDGELLM_ALLREDUCE_TUNING`: the file is loaded, and AUTO takes it.
fn loads_and_uses_it() {
    let path = std::env::var_os("EDGELLM_ALLREDUCE_TUNING").expect("the file is named");
    let text = std::fs::read_to_string(&path).unwrap();
    let written = Tuning::parse(&text).expect("the file as written");
    let loaded = tuning::active().expect("the file is loaded (a refusal is logged above)");
    assert_eq!(loaded.fingerprint(), written.fingerprint());
    assert_eq!(tuning::active_fingerprint(), written.fingerprint());
    let (theirs, ours) = (builtin(2, SMALL), ours());

    let two = Group::simulated(0, 2, 16 << 20).unwrap();
    let chosen = choose(Requested::Auto, &plain(2, SMALL), Some(&two));
    println!("2 ranks, {SMALL} B: built-in {theirs:?}, the file {ours:?}, AUTO chose {:?}", chosen.path);
    assert_eq!(chosen.path, Path::Custom(ours));
    let chosen = choose(Requested::Auto, &plain(2, LARGE), Some(&two));
    println!("2 ranks, {LARGE} B: built-in {:?}, the file NCCL, AUTO chose {:?}", builtin(2, LARGE), chosen.path);
    assert_eq!(chosen.path, Path::Nccl);
    assert_eq!(chosen.fallback, None, "NCCL by the file's choice, not as a fallback");
    // A strategy asked for by name is not AUTO's: the file does not change it.
    assert_eq!(
        choose(Requested::Family(Family::Lamport), &plain(2, SMALL), Some(&two)).path,
        Path::Custom(Family::Lamport)
    );
    drop(two);

    // No section for 4 ranks in the file: the built-in table's choice.
    let four = Group::simulated(0, 4, 16 << 20).unwrap();
    let chosen = choose(Requested::Auto, &plain(4, SMALL), Some(&four));
    println!("4 ranks, {SMALL} B: built-in {:?}, AUTO chose {:?}", builtin(4, SMALL), chosen.path);
    assert_eq!(chosen.path, builtin(4, SMALL).map_or(Path::Nccl, Path::Custom));
}
