use super::*;
use crate::contract::{EarAllReduceParams, EarFusedParams, EAR_MAX_BLOCKS};

#[test]
fn the_c_rules_see_the_rust_parameter_blocks() {
    // SAFETY: return constants.
    let (plain, fused) = unsafe { (ear_params_size(), ear_fused_params_size()) };
    assert_eq!(std::mem::size_of::<EarAllReduceParams>() as u64, plain);
    assert_eq!(std::mem::size_of::<EarFusedParams>() as u64, fused);
}

#[test]
fn kernel_names_say_algorithm_and_sync() {
    assert_eq!(kernel_name(Family::Lamport, Op::AllReduce, DataType::Bf16, 8), "ear_oneshot_lamport_bf16_n8");
    assert_eq!(kernel_name(Family::OneShot, Op::ResidualRmsNorm, DataType::Half, 2), "ear_oneshot_barrier_norm_f16_n2");
    assert_eq!(kernel_name(Family::TwoShot, Op::AllReduce, DataType::Float, 2), "ear_twoshot_polled_f32_n2");
    assert_eq!(kernel_name(Family::TwoShot, Op::AllReduce, DataType::Float, 16), "ear_twoshot_barrier_f32_n16");
    assert_eq!(norm_kernel_name(DataType::Float), "ear_residual_rmsnorm_f32");
}

#[test]
fn which_kernels_push_into_peers() {
    // The stems say it: "polled" and "lamport" push, "barrier" pulls, except the fused
    // two-shot, which pushes slices between its barriers.
    for n in crate::launch::family::RANK_COUNTS {
        assert!(Family::Lamport.writes_into_peers(Op::AllReduce, n));
        assert!(Family::Lamport.writes_into_peers(Op::ResidualRmsNorm, n));
        assert!(!Family::OneShot.writes_into_peers(Op::AllReduce, n));
        assert!(!Family::OneShot.writes_into_peers(Op::ResidualRmsNorm, n));
        assert!(Family::TwoShot.writes_into_peers(Op::ResidualRmsNorm, n));
        assert_eq!(
            Family::TwoShot.writes_into_peers(Op::AllReduce, n),
            Family::TwoShot.stem(Op::AllReduce, n) == "twoshot_polled"
        );
    }
}

#[test]
fn workspace_rule() {
    let small = workspace_bytes(1 << 20, 2);
    let large = workspace_bytes(16 << 20, 2);
    assert!(small >= 4 << 20 && large > small, "{small} {large}");
    assert!(workspace_bytes(16 << 20, 8) > large, "more ranks, more Lamport rows");
    assert_eq!(Family::Lamport.max_bytes(16 << 20), 2 << 20);
    assert_eq!(Family::Lamport.max_bytes(1 << 20), 1 << 20);
    assert_eq!(Family::OneShot.max_bytes(16 << 20), 16 << 20);
    assert_eq!(state_bytes(), 32 * EAR_MAX_BLOCKS as usize, "one copy of the counters per CTA index");
    assert_eq!(
        abort_offset(),
        8 * EAR_MAX_BLOCKS as u64 * crate::contract::EAR_MAX_RANKS as u64,
        "the abort word follows the signal slots"
    );
}

#[test]
fn fits_rules() {
    assert!(Family::OneShot.fused_fits(128, 8192, 2, 16 << 20, 2));
    assert!(!Family::Lamport.fused_fits(1024, 8192, 2, 16 << 20, 2), "over the 2 MiB Lamport cap");
    assert!(Family::Lamport.fits(2 << 20, 16 << 20) && !Family::Lamport.fits((2 << 20) + 16, 16 << 20));
}

#[test]
fn every_family_is_described_once() {
    for (i, f) in Family::ALL.iter().enumerate() {
        assert_eq!(Family::from_name(f.name()), Some(*f));
        assert_eq!(Family::from_name(&f.name().to_uppercase()), Some(*f), "any case");
        assert_eq!(Family::from_id(f.id()), Some(*f));
        for g in &Family::ALL[i + 1..] {
            assert!(f.name() != g.name() && f.id() != g.id(), "{f:?} and {g:?} share a name or an id");
        }
        assert!(f.id() >= 0 && f.id() != crate::contract::EAR_FAMILY_NORM, "{f:?}: the norm kernel's id");
        for source in f.describe().sources {
            let path = format!("{}/kernels/{source}.cu", env!("CARGO_MANIFEST_DIR"));
            assert!(std::path::Path::new(&path).exists(), "{path}");
        }
    }
    assert_eq!(Family::from_name("nccl"), None);
    // The simulations index their tables by id, EAR_FAMILY_NORM's slot holding a kernel of their own.
    let top = Family::ALL.iter().map(|f| f.id()).max().unwrap_or(0).max(crate::contract::EAR_FAMILY_NORM);
    assert_eq!(top as usize, Family::ALL.len(), "ids run from 0 with no gap but EAR_FAMILY_NORM's");
}

/// `C_NAME` of a rule kind: its enum's and its variant's names in SCREAMING_SNAKE_CASE, as
/// cbindgen writes them into kernels/ear_contract.h.
fn c_name(kind: &str, variant: impl std::fmt::Debug) -> String {
    let snake = |name: &str| {
        let mut out = String::new();
        for (i, c) in name.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    };
    format!("{}_{}", snake(kind), snake(&format!("{variant:?}")))
}

/// kernels/ear_families.h as the descriptions give it.
fn families_header() -> String {
    let mut ids = String::new();
    let mut rows = String::new();
    let mut sources = String::new();
    for f in Family::ALL {
        let (d, r) = (f.describe(), f.describe().rule);
        let push = |t: Transport| (t == Transport::Push) as u8;
        let contract = |name: &str| format!("EAR_FAMILY_{}", name.to_uppercase());
        ids += &format!("#define {} {}\n", contract(d.name), d.id);
        rows += &format!(
            " \\\n  M({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {})",
            d.name,
            contract(d.name),
            d.plain[0],
            d.plain[1],
            d.fused,
            c_name("EarGridRule", r.grid),
            c_name("EarFusedGridRule", r.fused_grid),
            c_name("EarCapacityRule", r.capacity),
            c_name("EarFusedFitRule", r.fused_fit),
            c_name("EarFlagsRule", r.flags),
            push(d.transport[0]),
            push(d.transport[1]),
            push(d.transport[2]),
        );
        sources.extend(d.sources.iter().map(|s| format!("#include \"{s}.cu\"\n")));
    }
    format!(
        "/*\n * The kernel families as src/launch/family.rs describes them, for the kernel simulations.\n * Generated by that file's tests, which fail when it is stale (EDGELLM_WRITE_GENERATED=1 cargo\n * test rewrites it): do not edit.\n */\n#ifndef EAR_FAMILIES_H\n#define EAR_FAMILIES_H\n\n#include \"allreduce_params.h\"\n\n/* EarPlan::family of each family (the exchange record's code too). */\n{ids}\n/* M(name, EAR_FAMILY_* id, plain stem at 2 ranks, plain stem at 4 and more, fused stem, EarRule's\n *   grid, fused_grid, capacity, fused_fit and flags, and whether the plain kernels at 2 ranks, at\n *   4 and more, and the fused kernel push into peers (1) or pull (0)): one row per family. */\n#define EAR_FOR_EACH_FAMILY(M){rows}\n\n#endif /* EAR_FAMILIES_H */\n\n/* Every family's kernel sources, for a translation unit that defines EAR_INCLUDE_FAMILY_SOURCES. */\n#if defined(EAR_INCLUDE_FAMILY_SOURCES) && !defined(EAR_FAMILY_SOURCES_INCLUDED)\n#define EAR_FAMILY_SOURCES_INCLUDED\n{sources}#endif\n"
    )
}

#[test]
fn the_committed_families_header_is_fresh() {
    let path = format!("{}/kernels/ear_families.h", env!("CARGO_MANIFEST_DIR"));
    let generated = families_header();
    if std::env::var("EDGELLM_WRITE_GENERATED").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &generated).unwrap();
    }
    assert!(
        std::fs::read_to_string(&path).ok().as_deref() == Some(generated.as_str()),
        "{path} is stale: EDGELLM_WRITE_GENERATED=1 cargo test --lib families_header rewrites it"
    );
}

#[test]
fn rank_counts_are_the_kernels_own() {
    let mut counts = [0i32; 16];
    // SAFETY: writes at most 16 entries into `counts`.
    let n = unsafe { ear_rank_counts(counts.as_mut_ptr(), counts.len() as i32) };
    assert_eq!(&counts[..n as usize], &RANK_COUNTS, "kernels/allreduce_params.h EAR_FOR_EACH_RANK_COUNT");
}
