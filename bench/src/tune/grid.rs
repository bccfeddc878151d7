//! `tune`'s grid sweep: per rank count and family, the plain all-reduce at a few representative
//! sizes at each candidate cap ([`Case::Grid`]), and the cap that AUTO's launches then take.
//!
//! The cap is one number per (rank count, family) that serves every size, so it is chosen on
//! the total time over the representative sizes; ties go to the smaller grid, since CTAs the
//! all-reduce does not need are SMs the model's kernels do not get (over PCIe a few CTAs keep
//! the link busy: the built-in caps, `edgellm_allreduce::builtin_grid_cap`).

use crate::case::{Case, GROUP_MAX};
use crate::record::{Record, Status};
use edgellm_allreduce::tuning::GridCap;
use edgellm_allreduce::{Family, LinkClass};
use std::collections::BTreeMap;

/// Candidate caps: from one CTA (enough to fill a PCIe link with stores) to NVLink's grids, and
/// the group's own cap ([`GROUP_MAX`]: every rank count's largest, whatever the SM count).
pub const CANDIDATES: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, GROUP_MAX];
/// `--quick`: a few CTAs, the PCIe two-rank cap, and the group's.
pub const QUICK_CANDIDATES: [u32; 3] = [4, 16, GROUP_MAX];

/// The representative sizes: a small message (latency), a middle one, and the family's largest
/// up to 1 MiB (bandwidth, where the grid matters most).
const SMALL: u64 = 16 << 10;
const MIDDLE: u64 = 256 << 10;
const LARGEST: u64 = 1 << 20;

/// The candidates of a run: `asked` (none: [`CANDIDATES`], or [`QUICK_CANDIDATES`]), ascending,
/// each once, the group's cap always last.
pub fn candidates(asked: &[u32], quick: bool) -> Vec<u32> {
    let mut out: Vec<u32> = match (asked.is_empty(), quick) {
        (false, _) => asked.to_vec(),
        (true, false) => CANDIDATES.to_vec(),
        (true, true) => QUICK_CANDIDATES.to_vec(),
    };
    out.push(GROUP_MAX);
    out.sort_unstable();
    out.dedup();
    out
}

/// The sizes a family's grid is measured at when it serves up to `max_served` bytes: 16 KiB,
/// 256 KiB (not with `quick`) and the largest power of two it serves up to 1 MiB.
pub fn sizes(max_served: u64, quick: bool) -> Vec<u64> {
    let top = match max_served.min(LARGEST) {
        0 => return Vec::new(),
        m => 1u64 << (63 - m.leading_zeros()),
    };
    let mut out = if quick { vec![SMALL, top] } else { vec![SMALL, MIDDLE, top] };
    out.retain(|&s| s <= top);
    out.sort_unstable();
    out.dedup();
    out
}

/// One grid timing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub nranks: i32,
    pub family: Family,
    /// The CTAs it ran with.
    pub ctas: u32,
    /// Whether that was the group's own cap (the `@max` row).
    pub group_max: bool,
    pub bytes: u64,
    /// Per-op time (µs), the median of the graph replays.
    pub us: f64,
}

/// The grid rows that ran and passed their checks (the CTAs from the record's path, `lamport@66`).
pub fn points(records: &[Record]) -> Vec<Point> {
    records
        .iter()
        .filter(|r| r.status == Status::Ok)
        .filter_map(|r| {
            let Case::Grid(family, asked) = Case::parse(&r.strategy)? else {
                return None;
            };
            let Case::Grid(_, ctas) = Case::parse(&r.path)? else {
                return None;
            };
            let us = r.median_us.filter(|t| t.is_finite() && *t > 0.0)?;
            Some(Point { nranks: r.ranks, family, ctas, group_max: asked == GROUP_MAX, bytes: r.bytes, us })
        })
        .collect()
}

/// What one (rank count, family)'s grid sweep found.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub nranks: i32,
    pub family: Family,
    /// The sizes summed.
    pub sizes: Vec<u64>,
    /// Each cap measured at every one of them, ascending, with its total (µs).
    pub totals: Vec<(u32, f64)>,
    /// The chosen cap.
    pub ctas: u32,
    /// The group's own cap, where its row ran.
    pub group_max: Option<u32>,
}

/// What [`choose`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Pick {
    pub ctas: u32,
    /// Each cap measured at every size, ascending, with its total (µs).
    pub totals: Vec<(u32, f64)>,
    pub sizes: Vec<u64>,
}

/// The cap of one (rank count, family) from `(ctas, bytes, µs)` timings (several of one cap at
/// one size are averaged): among the caps measured at every size, the smallest whose total is
/// within `tie` (a fraction) of the fastest total. None: no cap was measured at every size.
pub fn choose(points: &[(u32, u64, f64)], tie: f64) -> Option<Pick> {
    let mut sizes: Vec<u64> = points.iter().map(|p| p.1).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut by_cap: BTreeMap<u32, BTreeMap<u64, (f64, u32)>> = BTreeMap::new();
    for &(ctas, bytes, us) in points {
        let at = by_cap.entry(ctas).or_default().entry(bytes).or_insert((0.0, 0));
        (at.0, at.1) = (at.0 + us, at.1 + 1);
    }
    // A cap missing a size (n/a, failed) cannot be compared on the same total.
    let totals: Vec<(u32, f64)> = by_cap
        .into_iter()
        .filter(|(_, at)| at.len() == sizes.len())
        .map(|(ctas, at)| (ctas, at.values().map(|&(sum, n)| sum / n as f64).sum()))
        .collect();
    let best = totals.iter().map(|t| t.1).min_by(f64::total_cmp)?;
    let band = best * (1.0 + tie.max(0.0));
    // Ascending caps: the first within the band is the smallest.
    let ctas = totals.iter().find(|t| t.1 <= band)?.0;
    Some(Pick { ctas, totals, sizes })
}

/// Every (rank count, family)'s choice, in rank order then `Family::ALL`'s; `sizes(nranks,
/// family)`: the sizes that count (other sizes a run measured are left out).
pub fn choices(points: &[Point], tie: f64, sizes: &dyn Fn(i32, Family) -> Vec<u64>) -> Vec<Choice> {
    let mut ranks: Vec<i32> = points.iter().map(|p| p.nranks).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut out = Vec::new();
    for nranks in ranks {
        for family in Family::ALL {
            let wanted = sizes(nranks, family);
            let of: Vec<&Point> = points
                .iter()
                .filter(|p| p.nranks == nranks && p.family == family && wanted.contains(&p.bytes))
                .collect();
            let timings: Vec<(u32, u64, f64)> = of.iter().map(|p| (p.ctas, p.bytes, p.us)).collect();
            if let Some(Pick { ctas, totals, sizes }) = choose(&timings, tie) {
                let group_max = of.iter().find(|p| p.group_max).map(|p| p.ctas);
                out.push(Choice { nranks, family, sizes, totals, ctas, group_max });
            }
        }
    }
    out
}

/// The cap a family's kernels take on a group without a grid line: the built-in cap on its
/// links, within the group's own.
pub fn default_cap(links: LinkClass, family: Family, nranks: i32, group_max: u32) -> u32 {
    edgellm_allreduce::builtin_grid_cap(links, family, nranks).map_or(group_max, |c| c.min(group_max))
}

/// The caps every family's launches take in the tables' sweep (each chosen cap, default or not:
/// the tables are measured as AUTO will run them, whatever an earlier file says).
pub fn applied(choices: &[Choice]) -> Vec<GridCap> {
    choices.iter().map(|c| GridCap { nranks: c.nranks, family: c.family, ctas: c.ctas }).collect()
}

/// The file's grid lines for groups over `links`, rank counts `kept`: each choice that differs
/// from its default (where the group's cap is unknown, every choice: a line that states the
/// default changes nothing).
pub fn lines(choices: &[Choice], links: LinkClass, kept: &[i32]) -> Vec<GridCap> {
    choices
        .iter()
        .filter(|c| kept.contains(&c.nranks))
        .filter(|c| c.group_max.is_none_or(|max| c.ctas != default_cap(links, c.family, c.nranks, max)))
        .map(|c| GridCap { nranks: c.nranks, family: c.family, ctas: c.ctas })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_and_sizes() {
        assert_eq!(candidates(&[], false), [1, 2, 4, 8, 16, 32, 64, GROUP_MAX]);
        assert_eq!(candidates(&[], true), [4, 16, GROUP_MAX]);
        assert_eq!(candidates(&[8, 2, 8], false), [2, 8, GROUP_MAX], "sorted, once each, the group's cap added");
        assert_eq!(sizes(16 << 20, false), [16 << 10, 256 << 10, 1 << 20]);
        assert_eq!(sizes(16 << 20, true), [16 << 10, 1 << 20]);
        assert_eq!(sizes(600 << 10, false), [16 << 10, 256 << 10, 512 << 10], "the largest power of two served");
        assert_eq!(sizes(8 << 10, false), [8 << 10]);
        assert!(sizes(0, false).is_empty());
    }

    #[test]
    fn the_smallest_cap_within_the_tie_of_the_best_total() {
        // (ctas, bytes, µs) at 16 KiB and 1 MiB.
        let p = [
            (4, 16384, 5.0),
            (4, 1 << 20, 40.0),
            (16, 16384, 5.0),
            (16, 1 << 20, 20.4),
            (66, 16384, 5.1),
            (66, 1 << 20, 20.0),
        ];
        // Totals 45, 25.4, 25.1: 16 is within 3% of 66's, so the smaller grid wins.
        let pick = choose(&p, 0.03).unwrap();
        assert_eq!((pick.ctas, pick.sizes), (16, vec![16384, 1 << 20]));
        assert_eq!(pick.totals.iter().map(|t| t.0).collect::<Vec<_>>(), [4, 16, 66]);
        assert_eq!(choose(&p, 0.0).unwrap().ctas, 66, "no tolerance: the fastest total");
        // A cap missing a size is not compared; repeated timings are averaged.
        let p = [(4, 16384, 1.0), (16, 16384, 5.0), (16, 1 << 20, 20.0), (16, 1 << 20, 22.0)];
        let pick = choose(&p, 0.03).unwrap();
        assert_eq!((pick.ctas, pick.totals), (16, vec![(16, 26.0)]));
        assert_eq!(choose(&[], 0.03), None);
    }

    fn choice(nranks: i32, family: Family, ctas: u32, group_max: Option<u32>) -> Choice {
        Choice { nranks, family, sizes: vec![16384], totals: vec![(ctas, 1.0)], ctas, group_max }
    }

    #[test]
    fn lines_only_where_the_choice_is_not_the_default() {
        let same = LinkClass::SameDevice;
        let cs = [
            choice(2, Family::Lamport, 66, Some(66)),  // the group's cap: the default
            choice(2, Family::OneShot, 16, Some(66)),  // a line
            choice(4, Family::TwoShot, 8, None),       // the group's cap unknown: a line
            choice(16, Family::Lamport, 4, Some(128)), // not a kept rank count
        ];
        let grid = |n, family, ctas| GridCap { nranks: n, family, ctas };
        assert_eq!(lines(&cs, same, &[2, 4, 8]), [grid(2, Family::OneShot, 16), grid(4, Family::TwoShot, 8)]);
        assert_eq!(applied(&cs).len(), 4, "the sweep applies every choice, defaults too");
        // Over PCIe the staged push's built-in cap is the default, not the group's.
        let builtin = edgellm_allreduce::builtin_grid_cap(LinkClass::Pcie, Family::Push, 2).unwrap();
        assert_eq!(default_cap(LinkClass::Pcie, Family::Push, 2, 132), builtin);
        assert_eq!(default_cap(LinkClass::Pcie, Family::Push, 2, 1), 1, "within the group's cap");
        let pcie = [choice(2, Family::Push, builtin, Some(132)), choice(2, Family::Lamport, 132, Some(132))];
        assert!(lines(&pcie, LinkClass::Pcie, &[2]).is_empty());
        let pcie = [choice(2, Family::Push, 132, Some(132))];
        assert_eq!(lines(&pcie, LinkClass::Pcie, &[2]), [grid(2, Family::Push, 132)]);
    }

    #[test]
    fn grid_records_become_points_and_choices() {
        let rec = |strategy: &str, path: &str, bytes: u64, us: Option<f64>, status: Status| {
            let mut r = Record::new("sim", 2, "bf16", bytes, strategy, "GPU");
            (r.path, r.median_us, r.status) = (path.into(), us, status);
            r
        };
        let records = [
            rec("lamport@4", "lamport@4", 16384, Some(6.0), Status::Ok),
            rec("lamport@4", "lamport@4", 1 << 20, Some(30.0), Status::Ok),
            rec("lamport@max", "lamport@66", 16384, Some(5.0), Status::Ok),
            rec("lamport@max", "lamport@66", 1 << 20, Some(20.0), Status::Ok),
            rec("lamport@64", "", 16384, None, Status::NotApplicable),
            rec("oneshot@4", "oneshot@4", 16384, Some(1.0), Status::Failed),
            rec("lamport", "lamport", 16384, Some(1.0), Status::Ok),
            // A size that is not one of the family's grid sizes does not count.
            rec("lamport@4", "lamport@4", 4096, Some(0.1), Status::Ok),
        ];
        let ps = points(&records);
        assert_eq!(ps.len(), 5, "grid rows that ran and passed");
        assert!(ps.iter().any(|p| p.group_max && p.ctas == 66));
        let cs = choices(&ps, 0.03, &|_, _| vec![16384, 1 << 20]);
        assert_eq!(
            cs,
            [Choice {
                nranks: 2,
                family: Family::Lamport,
                sizes: vec![16384, 1 << 20],
                totals: vec![(4, 36.0), (66, 25.0)],
                ctas: 66,
                group_max: Some(66)
            }]
        );
    }
}
