//! `tune`'s report: what was measured where and what was chosen, in about fifty lines of plain
//! ASCII text, to attach to a bug report (`--report`, beside the tuning file).

use super::grid::{default_cap, Choice};
use crate::case::Mode;
use crate::stats::fmt_bytes;
use edgellm_allreduce::tuning::{Section, TunedOp, Tuning};
use edgellm_allreduce::{describe_links, group_class, Family, FusedChoice, Op, P2p, PairFacts};

/// The links of one rank count's group.
pub struct Group {
    pub nranks: i32,
    pub devices: Vec<i32>,
    pub facts: Vec<PairFacts>,
}

/// Everything the report says.
pub struct Facts<'a> {
    /// The command line.
    pub command: String,
    pub mode: Mode,
    /// The timing method in words.
    pub timing: String,
    /// The tuning (machine, links, library, grid lines, rows) as written, or as far as it got.
    pub tuning: &'a Tuning,
    /// The file written (path, fingerprint), or why none was.
    pub outcome: Result<(String, u64), String>,
    /// The groups measured, every rank count asked for.
    pub groups: &'a [Group],
    /// NVML's peer status of every ordered pair of the machine's GPUs (bus ids).
    pub p2p: &'a [(String, String, P2p)],
    /// `--probe-csv`: its path and summary lines, or why it could not be read.
    pub probe: Option<(String, Result<Vec<String>, String>)>,
    /// The grid sweep's choices (empty: none ran).
    pub grids: &'a [Choice],
}

/// How many pairs or links are listed one by one before the rest are counted.
const LISTED: usize = 8;

/// The report's text.
pub fn text(f: &Facts) -> String {
    let t = f.tuning;
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line("edgellm-allreduce tune report".into());
    line(format!("command: {}", f.command));
    line(match &f.outcome {
        Ok((path, fingerprint)) => format!("result: tuning file {path} (fingerprint {fingerprint:016x})"),
        Err(e) => format!("result: NO tuning file written: {e}"),
    });
    line(format!("library: {}; mode {}; {}", t.library, f.mode.name(), f.timing));
    line(format!("machine: {}, driver {}", t.machine.host, t.machine.driver));
    for g in &t.machine.gpus {
        line(format!("  gpu {} {}", g.bus_id, g.name));
    }

    line(format!("links: the tables serve groups over {} links", t.links.name()));
    for g in f.groups {
        let class = group_class(&g.facts);
        let note = if class == t.links { "" } else { " (not tabled: other links)" };
        line(format!("  {} ranks on GPUs {:?}: {}{note}", g.nranks, g.devices, describe_links(&g.facts)));
    }

    line("peer access (NVML, ordered GPU pairs):".into());
    for l in p2p_lines(f.p2p) {
        line(format!("  {l}"));
    }

    match &f.probe {
        None => line(
            "probe: none (tune --probe runs it first; --probe-csv takes the CSV of `edgellm-allreduce-bench probe`)"
                .into(),
        ),
        Some((path, Err(e))) => line(format!("probe {path}: unreadable: {e}")),
        Some((path, Ok(lines))) => {
            line(format!("probe {path} (best over sizes and CTAs; round trips in us):"));
            for l in lines.iter().take(LISTED) {
                line(format!("  {l}"));
            }
            if lines.len() > LISTED {
                line(format!("  ... {} more links in the CSV", lines.len() - LISTED));
            }
        }
    }

    line("transport (push: stores into peers; pull: loads from peers):".into());
    for g in f.groups {
        line(format!("  {} ranks: {}", g.nranks, transports(g.nranks)));
    }

    if f.grids.is_empty() {
        line("grid caps: not measured (each family's built-in cap)".into());
    } else {
        let sizes: Vec<String> = f.grids[0].sizes.iter().map(|&b| short(b)).collect();
        line(format!("grid caps (CTAs; total us over {} at each cap; * chosen):", sizes.join("+")));
        for c in f.grids {
            let written = t.grids.iter().any(|g| g.nranks == c.nranks && g.family == c.family);
            let default = c.group_max.map(|max| default_cap(t.links, c.family, c.nranks, max));
            let tabled = f.groups.iter().any(|g| g.nranks == c.nranks && group_class(&g.facts) == t.links);
            let verdict = match (written, default) {
                (true, Some(d)) => format!("written (default {d})"),
                (true, None) => "written".to_owned(),
                (false, _) if !tabled => "not tabled".to_owned(),
                (false, _) => "the default".to_owned(),
            };
            let totals: Vec<String> = c
                .totals
                .iter()
                .map(|&(ctas, us)| format!("{ctas}:{us:.1}{}", if ctas == c.ctas { "*" } else { "" }))
                .collect();
            line(format!(
                "  {} ranks {:<8} {:>3} CTAs, {verdict}: {}",
                c.nranks,
                c.family.name(),
                c.ctas,
                totals.join(" ")
            ));
        }
    }
    let fused = t.sections.iter().any(|s| s.key.op == TunedOp::Fused);
    if fused && !t.grids.is_empty() {
        // The library launches a fused kernel at its family's cap only (no grid argument).
        line("  (fused:<family> rows were timed at the built-in caps; the grid lines cap them too)".into());
    }
    let ungridded = t.grids.iter().filter(|g| !f.grids.iter().any(|c| c.nranks == g.nranks && c.family == g.family));
    for g in ungridded {
        line(format!("  grid line {} ranks {} ctas={}", g.nranks, g.family.name(), g.ctas));
    }

    line("tables (bytes up to -> way; push/pull as above):".into());
    if t.sections.is_empty() {
        line("  none".into());
    }
    for s in &t.sections {
        line(format!("  {}: {}", s.key, rows(s)));
    }
    out
}

/// `<=16K lamport(push), <=max oneshot(pull)`.
fn rows(s: &Section) -> String {
    let op = match s.key.op {
        TunedOp::Plain => Op::AllReduce,
        TunedOp::Fused => Op::ResidualRmsNorm,
    };
    let way = |w: FusedChoice| match w {
        FusedChoice::Nccl => "nccl".to_owned(),
        FusedChoice::Fused(f) => {
            format!("{}{}({})", if op == Op::AllReduce { "" } else { "fused:" }, f.name(), moves(f, op, s.key.nranks))
        }
        FusedChoice::Split(f) => format!("split:{}({})", f.name(), moves(f, Op::AllReduce, s.key.nranks)),
    };
    let parts: Vec<String> = s
        .rows
        .iter()
        .map(|&(bound, w)| format!("<={} {}", if bound == u64::MAX { "max".into() } else { short(bound) }, way(w)))
        .collect();
    parts.join(", ")
}

fn moves(f: Family, op: Op, nranks: i32) -> &'static str {
    if f.writes_into_peers(op, nranks) {
        "push"
    } else {
        "pull"
    }
}

/// Which families push and which pull on `nranks` ranks, plain and fused.
fn transports(nranks: i32) -> String {
    let of = |op: Op, push: bool| -> String {
        let names: Vec<&str> =
            Family::ALL.iter().filter(|f| f.writes_into_peers(op, nranks) == push).map(|f| f.name()).collect();
        if names.is_empty() {
            "-".into()
        } else {
            names.join(",")
        }
    };
    format!(
        "plain push {} pull {}; fused push {} pull {}",
        of(Op::AllReduce, true),
        of(Op::AllReduce, false),
        of(Op::ResidualRmsNorm, true),
        of(Op::ResidualRmsNorm, false)
    )
}

/// "16K", "1M", "1536" (bytes).
fn short(b: u64) -> String {
    fmt_bytes(b).replace(" KiB", "K").replace(" MiB", "M").replace(" GiB", "G").replace(" B", "")
}

fn status(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "unknown",
    }
}

/// One line when every pair says the same; else a line per pair (the first few).
fn p2p_lines(pairs: &[(String, String, P2p)]) -> Vec<String> {
    let say = |p: P2p| format!("reads {}, writes {}", status(p.reads), status(p.writes));
    match pairs {
        [] => vec!["no pair of GPUs (one GPU)".into()],
        [(_, _, first), ..] if pairs.iter().all(|(_, _, p)| p == first) => {
            let unknown = if *first == P2p::UNKNOWN { " (no NVML, or it does not say)" } else { "" };
            vec![format!("all {} pairs: {}{unknown}", pairs.len(), say(*first))]
        }
        _ => {
            let mut out: Vec<String> =
                pairs.iter().take(LISTED).map(|(a, b, p)| format!("{a} -> {b}: {}", say(*p))).collect();
            if pairs.len() > LISTED {
                out.push(format!("... {} more pairs", pairs.len() - LISTED));
            }
            out
        }
    }
}

/// NVML's status of every ordered pair of `bus_ids`.
pub fn p2p_pairs(bus_ids: &[String]) -> Vec<(String, String, P2p)> {
    let mut out = Vec::new();
    for a in bus_ids {
        for b in bus_ids.iter().filter(|b| *b != a) {
            out.push((a.clone(), b.clone(), edgellm_allreduce::nvml_p2p(a, b)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgellm_allreduce::tuning::{library_id, Gpu, GridCap, Machine, SectionKey};
    use edgellm_allreduce::{DataType, LinkClass};

    fn tuning() -> Tuning {
        let plain = SectionKey { op: TunedOp::Plain, nranks: 2, dtype: None, width: None };
        let fused = SectionKey {
            op: TunedOp::Fused,
            nranks: 2,
            dtype: Some(DataType::Bf16),
            width: Some(edgellm_allreduce::tuning::RowWidth::Any),
        };
        Tuning {
            machine: Machine {
                host: "box".into(),
                driver: "580.82.09 (CUDA 13.0)".into(),
                gpus: vec![
                    Gpu { bus_id: "0000:17:00.0".into(), name: "NVIDIA RTX PRO 6000".into() },
                    Gpu { bus_id: "0000:3d:00.0".into(), name: "NVIDIA RTX PRO 6000".into() },
                ],
            },
            links: LinkClass::Pcie,
            library: library_id(),
            grids: vec![GridCap { nranks: 2, family: Family::Push, ctas: 8 }],
            sections: vec![
                Section {
                    key: plain,
                    rows: vec![(16 << 10, FusedChoice::Fused(Family::Push)), (u64::MAX, FusedChoice::Nccl)],
                },
                Section {
                    key: fused,
                    rows: vec![
                        (1 << 20, FusedChoice::Fused(Family::Push)),
                        (4 << 20, FusedChoice::Split(Family::OneShot)),
                        (u64::MAX, FusedChoice::Nccl),
                    ],
                },
            ],
        }
    }

    #[test]
    fn the_report_says_where_what_and_why() {
        let t = tuning();
        let pcie = PairFacts::new(false, Some(true), Some(false), Some(1));
        let no_reads = P2p { reads: Some(false), writes: Some(true) };
        let groups = [Group { nranks: 2, devices: vec![0, 1], facts: vec![pcie.with_p2p(no_reads), pcie] }];
        let (a, b) = ("0000:17:00.0".to_owned(), "0000:3d:00.0".to_owned());
        let p2p = [(a.clone(), b.clone(), no_reads), (b, a, P2p { reads: Some(true), writes: Some(true) })];
        let grids = [
            Choice {
                nranks: 2,
                family: Family::Push,
                sizes: vec![16 << 10, 1 << 20],
                totals: vec![(4, 40.0), (8, 30.0), (16, 29.5), (188, 31.0)],
                ctas: 8,
                group_max: Some(188),
            },
            Choice {
                nranks: 2,
                family: Family::Lamport,
                sizes: vec![16 << 10, 1 << 20],
                totals: vec![(4, 40.0), (188, 20.0)],
                ctas: 188,
                group_max: Some(188),
            },
        ];
        let facts = Facts {
            command: "edgellm-allreduce-bench tune --ranks 2 --probe-csv probe.csv".into(),
            mode: Mode::Real,
            timing: "graph replay, 20 ops per graph".into(),
            tuning: &t,
            outcome: Ok(("/opt/t.txt".into(), 0xabc)),
            groups: &groups,
            p2p: &p2p,
            probe: Some(("probe.csv".into(), Ok(vec!["gpu0 -> gpu1 (peers): sm_write 52.5 GB/s".into()]))),
            grids: &grids,
        };
        let text = text(&facts);
        for want in [
            "result: tuning file /opt/t.txt (fingerprint 0000000000000abc)",
            "machine: box, driver 580.82.09 (CUDA 13.0)",
            "  gpu 0000:3d:00.0 NVIDIA RTX PRO 6000",
            "links: the tables serve groups over PCIe links",
            "  2 ranks on GPUs [0, 1]: links: PCIe (all 2 pairs)",
            "  0000:17:00.0 -> 0000:3d:00.0: reads NO, writes yes",
            "  0000:3d:00.0 -> 0000:17:00.0: reads yes, writes yes",
            "  gpu0 -> gpu1 (peers): sm_write 52.5 GB/s",
            "grid caps (CTAs; total us over 16K+1M at each cap; * chosen):",
            "  2 ranks push       8 CTAs, written (default 16): 4:40.0 8:30.0* 16:29.5 188:31.0",
            "  2 ranks lamport  188 CTAs, the default: 4:40.0 188:20.0*",
            "  (fused:<family> rows were timed at the built-in caps; the grid lines cap them too)",
            "  plain ranks=2 dtype=any: <=16K push(push), <=max nccl",
            "  fused ranks=2 dtype=bf16 rows=any: <=1M fused:push(push), <=4M split:oneshot(pull), <=max nccl",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        // Which families push and which pull, per rank count, from the families themselves.
        let push_pull = text.lines().find(|l| l.starts_with("  2 ranks: plain push")).unwrap();
        for f in Family::ALL {
            assert!(push_pull.contains(f.name()), "{push_pull}");
        }
        assert!(push_pull.contains("pull oneshot"), "{push_pull}");
        // Plain text for a bug report: ASCII, no escape sequences, about fifty lines.
        assert!(text.is_ascii() && !text.contains('\u{1b}'), "{text}");
        assert!(text.lines().count() <= 50, "{}", text.lines().count());

        // A run that wrote nothing says why; without grids, probe or GPU pairs, says so.
        let failed = Facts { outcome: Err("the run stopped".into()), probe: None, grids: &[], p2p: &[], ..facts };
        let text = super::text(&failed);
        assert!(text.contains("result: NO tuning file written: the run stopped"), "{text}");
        assert!(text.contains("grid caps: not measured"), "{text}");
        assert!(text.contains("probe: none") && text.contains("no pair of GPUs"), "{text}");
        assert!(text.contains("  grid line 2 ranks push ctas=8"), "a line without its sweep still shows: {text}");
    }

    #[test]
    fn nvml_pairs_that_agree_take_one_line() {
        let same = |n: usize, p: P2p| (0..n).map(|i| (format!("a{i}"), format!("b{i}"), p)).collect::<Vec<_>>();
        let ok = P2p { reads: Some(true), writes: Some(true) };
        assert_eq!(p2p_lines(&same(56, ok)), ["all 56 pairs: reads yes, writes yes"]);
        assert_eq!(
            p2p_lines(&same(2, P2p::UNKNOWN)),
            ["all 2 pairs: reads unknown, writes unknown (no NVML, or it does not say)"]
        );
        let mut mixed = same(12, ok);
        mixed[3].2 = P2p { reads: Some(false), writes: Some(true) };
        let lines = p2p_lines(&mixed);
        assert_eq!(lines.len(), LISTED + 1);
        assert_eq!(lines[3], "a3 -> b3: reads NO, writes yes");
        assert_eq!(lines[LISTED], "... 4 more pairs");
    }
}
