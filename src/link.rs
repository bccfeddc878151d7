//! What carries the bytes between two ranks: one device's memory, NVLink, PCIe, or nothing (no
//! peer access). AUTO keeps one table per [`LinkClass`] (`crate::launch::strategy`), because the
//! families that win on NVLink (Lamport and the 2-rank two-shot write into their peers) are the
//! ones a PCIe fabric may starve.
//!
//! The facts of one ordered pair of ranks ([`PairFacts`]) come from the driver
//! (`cuDeviceGetP2PAttribute`, [`query`]) and are classified here by [`classify`], a pure
//! function, so the rule is tested on fake topologies. A group's class is its worst pair
//! ([`group_class`]); [`describe`] says it in one line for the log.
//!
//! The rule. The driver names no NVLink attribute, so the class is read from what the link
//! does:
//! - ranks on one device: [`LinkClass::SameDevice`] (simulated ranks; nothing is asked);
//! - no peer access (`CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED` 0): [`LinkClass::NoPeer`];
//! - peer access and native atomics over the link
//!   (`CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED` 1: "all CUDA-valid atomic operations
//!   over the link are supported", cuda.h): [`LinkClass::NvLink`]. NVLink carries every atomic
//!   natively; PCIe peer-to-peer does not promise them (PCIe AtomicOps need completer and
//!   routing support at every switch and root port on the way, which platforms often lack, and
//!   CUDA 13 added `..._ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED` for links with some of them). A
//!   PCIe fabric that reported every atomic native would be taken as NVLink: none is known, and
//!   a tuning file measured there (`crate::launch::tuning`) replaces the tables whatever the class;
//! - peer access without native atomics: [`LinkClass::Pcie`];
//! - an attribute the driver did not answer: peer access reported but atomics unknown is
//!   taken as PCIe (the cautious tables: they never push large messages into peers); access
//!   unknown is taken as no peer (nothing can be assumed to reach the peer).
//!
//! - NVML (optional, `crate::nvml`) reports peer writes unsupported: [`LinkClass::NoPeer`]
//!   (every family writes into its peers). Peer reads unsupported leave the class as it is, and
//!   no family that loads from peers runs on the group ([`reads_supported`]).
//!
//! The performance rank (`CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`, "0 being the value used
//! for most performant link") is kept for the log only: it orders the links of one machine, not
//! link kinds across machines, so it decides no class.

use crate::nvml::P2p;
use std::fmt::Write as _;

/// How the bytes between two ranks travel, from best to worst (the derived order: a group's
/// class is its worst pair's, [`group_class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkClass {
    /// Both ranks on one device (simulated ranks): its memory carries everything.
    SameDevice,
    /// Peer access with native atomics: NVLink (or NVSwitch).
    NvLink,
    /// Peer access without native atomics: PCIe peer-to-peer.
    Pcie,
    /// No peer access: the custom kernels cannot run; NCCL always.
    NoPeer,
}

impl LinkClass {
    pub const ALL: [LinkClass; 4] = [LinkClass::SameDevice, LinkClass::NvLink, LinkClass::Pcie, LinkClass::NoPeer];

    /// The class as one byte of the multi-process exchange record (0 is no class: a record of a
    /// build that did not send one).
    pub fn code(self) -> u8 {
        match self {
            LinkClass::SameDevice => 1,
            LinkClass::NvLink => 2,
            LinkClass::Pcie => 3,
            LinkClass::NoPeer => 4,
        }
    }

    /// The class of [`LinkClass::code`]; None for 0 and for codes of no class.
    pub fn from_code(code: u8) -> Option<LinkClass> {
        LinkClass::ALL.into_iter().find(|c| c.code() == code)
    }

    /// Its name in the log: "NVLink", "PCIe", "same device", "no peer access".
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::SameDevice => "same device",
            LinkClass::NvLink => "NVLink",
            LinkClass::Pcie => "PCIe",
            LinkClass::NoPeer => "no peer access",
        }
    }

    /// Its word in the tuning file's `links:` line: `same-device`, `nvlink`, `pcie`, `no-peer`.
    pub fn token(self) -> &'static str {
        match self {
            LinkClass::SameDevice => "same-device",
            LinkClass::NvLink => "nvlink",
            LinkClass::Pcie => "pcie",
            LinkClass::NoPeer => "no-peer",
        }
    }

    /// The class of a [`LinkClass::token`].
    pub fn from_token(token: &str) -> Option<LinkClass> {
        LinkClass::ALL.into_iter().find(|c| c.token() == token)
    }
}

/// What is known of the link from one rank's device to another's; `None` where the driver did
/// not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairFacts {
    /// [`classify`] of the rest.
    pub class: LinkClass,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (lower is better; for the log only).
    pub perf_rank: Option<i32>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: Option<bool>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
    pub access: Option<bool>,
    /// What NVML reports of peer reads and writes ([`P2p::UNKNOWN`] without NVML).
    pub p2p: P2p,
}

impl PairFacts {
    /// The facts of one pair, classified.
    pub fn new(
        same_device: bool,
        access: Option<bool>,
        native_atomics: Option<bool>,
        perf_rank: Option<i32>,
    ) -> PairFacts {
        let class = classify(same_device, access, native_atomics, perf_rank);
        PairFacts { class, perf_rank, native_atomics, access, p2p: P2p::UNKNOWN }
    }

    /// The same facts with NVML's: peer writes unsupported take the pair to no peer access.
    pub fn with_p2p(self, p2p: P2p) -> PairFacts {
        let class = if p2p.writes == Some(false) && self.class != LinkClass::SameDevice {
            LinkClass::NoPeer
        } else {
            self.class
        };
        PairFacts { class, p2p, ..self }
    }

    /// Two ranks on one device: nothing to ask the driver.
    pub fn same_device() -> PairFacts {
        PairFacts::new(true, None, None, None)
    }
}

/// The class of one ordered pair (the module documentation states the rule and its sources).
/// `perf_rank` is taken so that every fact of a pair passes through one function, and decides
/// nothing: it ranks one machine's links, not link kinds.
pub(crate) fn classify(
    same_device: bool,
    access: Option<bool>,
    native_atomics: Option<bool>,
    _perf_rank: Option<i32>,
) -> LinkClass {
    match (same_device, access, native_atomics) {
        (true, _, _) => LinkClass::SameDevice,
        (false, Some(true), Some(true)) => LinkClass::NvLink,
        (false, Some(true), _) => LinkClass::Pcie,
        (false, Some(false) | None, _) => LinkClass::NoPeer,
    }
}

/// A group's class: its worst pair's (a call waits for its slowest link); `SameDevice` for no
/// pairs (one rank: nothing crosses a link).
pub fn group_class(facts: &[PairFacts]) -> LinkClass {
    facts.iter().map(|f| f.class).max().unwrap_or(LinkClass::SameDevice)
}

/// The facts of every ordered pair of distinct ranks, rank `r` on `devices[r]`: ranks sharing a
/// device are [`PairFacts::same_device`] without a question, the others `query(device, peer)`.
pub fn pair_facts(devices: &[i32], query: impl Fn(i32, i32) -> PairFacts) -> Vec<PairFacts> {
    let mut out = Vec::new();
    for (a, &da) in devices.iter().enumerate() {
        for (b, &db) in devices.iter().enumerate() {
            if a != b {
                out.push(if da == db { PairFacts::same_device() } else { query(da, db) });
            }
        }
    }
    out
}

/// The facts of the link from `device` to `peer` as this machine's driver (and NVML, where
/// there is one) reports them (two distinct device ordinals; the same ordinal twice is
/// [`PairFacts::same_device`]).
pub fn query(device: i32, peer: i32) -> PairFacts {
    if device == peer {
        return PairFacts::same_device();
    }
    let a = crate::cuda::p2p_attributes(device, peer);
    let p2p = match (crate::cuda::pci_bus_id(device), crate::cuda::pci_bus_id(peer)) {
        (Ok(from), Ok(to)) => crate::nvml::p2p(&from, &to),
        _ => P2p::UNKNOWN,
    };
    PairFacts::new(false, a.access, a.native_atomics, a.perf_rank).with_p2p(p2p)
}

/// Whether no pair's peer reads are reported unsupported (NVML): else no family that loads
/// from peers may run on the group, and its self-test issues no peer load.
pub(crate) fn reads_supported(facts: &[PairFacts]) -> bool {
    facts.iter().all(|f| f.p2p.reads != Some(false))
}

/// One info line for a group's links: `links: NVLink (all 2 pairs)`, `links: PCIe (all 12
/// pairs), P2P perf rank 1`, `links: mixed: 2 NVLink pairs, 10 PCIe pairs; AUTO uses the PCIe
/// tables`, with a note where the driver left an attribute unanswered.
pub fn describe(facts: &[PairFacts]) -> String {
    let worst = group_class(facts);
    let mut line = String::from("links: ");
    let plural = |n: usize| if n == 1 { "pair" } else { "pairs" };
    let counts: Vec<(LinkClass, usize)> = LinkClass::ALL
        .into_iter()
        .map(|c| (c, facts.iter().filter(|f| f.class == c).count()))
        .filter(|&(_, n)| n > 0)
        .collect();
    match counts.as_slice() {
        [] => line.push_str("none (one rank)"),
        [(class, n)] => {
            let _ = write!(line, "{} (all {n} {})", class.name(), plural(*n));
            let mut ranks: Vec<i32> = facts.iter().filter_map(|f| f.perf_rank).collect();
            ranks.sort_unstable();
            ranks.dedup();
            match ranks.as_slice() {
                [] => {}
                [r] => {
                    let _ = write!(line, ", P2P perf rank {r}");
                }
                [lo, .., hi] => {
                    let _ = write!(line, ", P2P perf ranks {lo}-{hi}");
                }
            }
        }
        many => {
            let parts: Vec<String> = many.iter().map(|(c, n)| format!("{n} {} {}", c.name(), plural(*n))).collect();
            let _ = write!(line, "mixed: {}; ", parts.join(", "));
            line.push_str(&match worst {
                LinkClass::NoPeer => "all-reduce uses NCCL".to_owned(),
                _ => format!("AUTO uses the {} tables", worst.name()),
            });
        }
    }
    let unknown_atomics = facts.iter().filter(|f| f.class == LinkClass::Pcie && f.native_atomics.is_none()).count();
    if unknown_atomics > 0 {
        let _ =
            write!(line, " (native atomics unknown for {unknown_atomics} {}: taken as PCIe)", plural(unknown_atomics));
    }
    let no_reads = facts.iter().filter(|f| f.p2p.reads == Some(false)).count();
    if no_reads > 0 {
        let _ = write!(line, " (peer reads unsupported for {no_reads} {} (NVML): no pulling family)", plural(no_reads));
    }
    let unknown_access = facts.iter().filter(|f| f.class == LinkClass::NoPeer && f.access.is_none()).count();
    if unknown_access > 0 {
        let _ = write!(line, " (peer access unknown for {unknown_access} {}: taken as none)", plural(unknown_access));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvlink() -> PairFacts {
        PairFacts::new(false, Some(true), Some(true), Some(0))
    }
    fn pcie(rank: i32) -> PairFacts {
        PairFacts::new(false, Some(true), Some(false), Some(rank))
    }
    fn no_peer() -> PairFacts {
        PairFacts::new(false, Some(false), Some(false), Some(0))
    }
    /// A fake machine: `kind(a, b)` for each ordered pair of distinct devices.
    fn topology(devices: &[i32], kind: impl Fn(i32, i32) -> PairFacts) -> Vec<PairFacts> {
        pair_facts(devices, kind)
    }

    #[test]
    fn the_rule() {
        use LinkClass::*;
        assert_eq!(classify(true, Some(false), None, None), SameDevice);
        assert_eq!(classify(false, Some(true), Some(true), Some(0)), NvLink);
        assert_eq!(classify(false, Some(true), Some(false), Some(1)), Pcie);
        assert_eq!(classify(false, Some(false), Some(true), Some(0)), NoPeer);
        assert_eq!(classify(false, Some(true), None, None), Pcie, "atomics unknown: PCIe");
        assert_eq!(classify(false, None, Some(true), None), NoPeer, "access unknown: no peer");
        assert_eq!(classify(false, None, None, None), NoPeer);
        assert_eq!(classify(false, Some(true), Some(false), Some(0)), Pcie, "the perf rank decides nothing");
        assert!(SameDevice < NvLink && NvLink < Pcie && Pcie < NoPeer);
    }

    #[test]
    fn fake_topologies() {
        // 2 x H200 over NVLink.
        let f = topology(&[0, 1], |_, _| nvlink());
        assert_eq!(f.len(), 2, "ordered pairs");
        assert_eq!(group_class(&f), LinkClass::NvLink);
        assert_eq!(describe(&f), "links: NVLink (all 2 pairs), P2P perf rank 0");
        // 4 GPUs on PCIe, two switches: perf rank 0 within, 1 across.
        let f = topology(&[0, 1, 2, 3], |a, b| pcie((a / 2 != b / 2) as i32));
        assert_eq!(f.len(), 12);
        assert_eq!(group_class(&f), LinkClass::Pcie);
        assert_eq!(describe(&f), "links: PCIe (all 12 pairs), P2P perf ranks 0-1");
        let f = topology(&[0, 1], |_, _| pcie(1));
        assert_eq!(describe(&f), "links: PCIe (all 2 pairs), P2P perf rank 1");
        // NVLink bridges in pairs (0-1, 2-3), PCIe between them: the worst decides.
        let f = topology(&[0, 1, 2, 3], |a, b| if a / 2 == b / 2 { nvlink() } else { pcie(1) });
        assert_eq!(group_class(&f), LinkClass::Pcie);
        assert_eq!(describe(&f), "links: mixed: 4 NVLink pairs, 8 PCIe pairs; AUTO uses the PCIe tables");
        // One direction without peer access (an IOMMU / ACS setting).
        let f = topology(&[0, 1], |a, _| if a == 1 { no_peer() } else { pcie(0) });
        assert_eq!(group_class(&f), LinkClass::NoPeer);
        assert!(
            describe(&f) == "links: mixed: 1 PCIe pair, 1 no peer access pair; all-reduce uses NCCL",
            "{}",
            describe(&f)
        );
        // No P2P at all (GeForce cards).
        let f = topology(&[0, 1], |_, _| no_peer());
        assert_eq!(group_class(&f), LinkClass::NoPeer);
        assert_eq!(describe(&f), "links: no peer access (all 2 pairs), P2P perf rank 0");
    }

    #[test]
    fn missing_attributes_and_simulated_ranks() {
        // A driver that answers only the access question.
        let f = topology(&[0, 1], |_, _| PairFacts::new(false, Some(true), None, None));
        assert_eq!(group_class(&f), LinkClass::Pcie);
        assert_eq!(describe(&f), "links: PCIe (all 2 pairs) (native atomics unknown for 2 pairs: taken as PCIe)");
        let f = topology(&[0, 1], |_, _| PairFacts::new(false, None, None, None));
        assert_eq!(group_class(&f), LinkClass::NoPeer);
        assert!(describe(&f).ends_with("(peer access unknown for 2 pairs: taken as none)"));
        // Simulated ranks: no question is asked.
        let f = topology(&[3, 3, 3, 3], |_, _| panic!("never asked for one device"));
        assert_eq!(f.len(), 12);
        assert_eq!(group_class(&f), LinkClass::SameDevice);
        assert_eq!(describe(&f), "links: same device (all 12 pairs)");
        // Two ranks on one device, one on another.
        let f = topology(&[0, 0, 1], |_, _| nvlink());
        assert_eq!(group_class(&f), LinkClass::NvLink);
        assert!(describe(&f).starts_with("links: mixed: 2 same device pairs, 4 NVLink pairs"));
        assert_eq!(group_class(&[]), LinkClass::SameDevice);
        assert_eq!(describe(&[]), "links: none (one rank)");
        assert_eq!(query(2, 2), PairFacts::same_device(), "no driver needed");
    }

    #[test]
    fn nvml_says_which_directions_work() {
        let writes_only = P2p { reads: Some(false), writes: Some(true) };
        let f = topology(&[0, 1], |_, _| pcie(0).with_p2p(writes_only));
        assert_eq!(group_class(&f), LinkClass::Pcie, "reads unsupported: still PCIe");
        assert!(!reads_supported(&f));
        assert!(describe(&f).ends_with("(peer reads unsupported for 2 pairs (NVML): no pulling family)"));
        let no_writes = P2p { reads: Some(true), writes: Some(false) };
        assert_eq!(pcie(0).with_p2p(no_writes).class, LinkClass::NoPeer, "writes unsupported: no peer");
        assert_eq!(PairFacts::same_device().with_p2p(no_writes).class, LinkClass::SameDevice);
        assert!(reads_supported(&[pcie(0), pcie(0).with_p2p(P2p::UNKNOWN)]), "unknown: supported");
    }

    #[test]
    fn codes_and_tokens_round_trip() {
        for c in LinkClass::ALL {
            assert_eq!(LinkClass::from_code(c.code()), Some(c));
            assert_eq!(LinkClass::from_token(c.token()), Some(c));
        }
        assert_eq!(LinkClass::from_code(0), None, "0: no class sent");
        assert_eq!(LinkClass::from_code(5), None);
        assert_eq!(LinkClass::from_token("NVLink"), None, "tokens are exact");
    }

    #[test]
    fn without_a_driver_a_pair_has_no_peer() {
        // On this CPU-only machine (or any machine where the driver does not answer) every
        // attribute is unknown: the link is taken as no peer access, never as NVLink.
        if crate::cuda::device_count().is_err() {
            assert_eq!(query(0, 1).class, LinkClass::NoPeer);
        }
    }
}
