//! Why a group failed its peer self-test (`crate::group::selftest` runs it): plain values that
//! every rank computes alike from the gathered verdicts, and their message with the known fixes.

use std::fmt;

/// What failed, between rank `a` and rank `b` of a [`SelfTestProblem`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SelfTestKind {
    /// Rank a ran no self-test kernel: it was not launched, its launch failed, or its verdict
    /// did not reach the other ranks.
    NotRun,
    /// Rank a's kernel ended with a CUDA error.
    Faulted,
    /// Rank a's kernel had not finished at the host's deadline: it stalled, and may still run.
    DidNotFinish,
    /// Rank a could not map rank b's workspace.
    MappingFailed,
    /// Rank a's token never arrived in rank b's workspace (rank a's stores over the link).
    WriteLost,
    /// Rank a's token arrived garbled in rank b's workspace.
    WriteWrong,
    /// Rank a's loads of rank b's workspace returned another value than b's token.
    ReadWrong,
    /// Rank a's loads of rank b's workspace never returned b's token within the bound.
    ReadTimedOut,
    /// Rank a's stores into rank b's workspace ran far slower than a PCIe link carries (the
    /// bandwidth check); every token arrived.
    SlowLink,
}

impl SelfTestKind {
    fn name(self) -> &'static str {
        match self {
            SelfTestKind::NotRun => "not run",
            SelfTestKind::Faulted => "kernel failed",
            SelfTestKind::DidNotFinish => "kernel did not finish",
            SelfTestKind::MappingFailed => "mapping failed",
            SelfTestKind::WriteLost => "write lost",
            SelfTestKind::WriteWrong => "write wrong",
            SelfTestKind::ReadWrong => "read wrong",
            SelfTestKind::ReadTimedOut => "read timed out",
            SelfTestKind::SlowLink => "slow link",
        }
    }
}

/// One problem the self-test found: `kind` between rank `a` and rank `b` (`a -> b`: a's stores
/// into b's workspace, or a's loads from it), or of rank `a` alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SelfTestProblem {
    pub kind: SelfTestKind,
    pub a: i32,
    pub b: Option<i32>,
}

impl SelfTestProblem {
    /// The order in which problems are reported, the same on every rank: a rank that did not
    /// take part, faulted or stalled explains its pairs' failures, so ranks come first (by
    /// rank), then failed mappings, then the lowest pair `(a, b)`, then the kind.
    pub(crate) fn order(&self) -> (u8, i32, i32, u8) {
        let class = match self.kind {
            SelfTestKind::NotRun => 0,
            SelfTestKind::Faulted => 1,
            SelfTestKind::DidNotFinish => 2,
            SelfTestKind::MappingFailed => 3,
            _ => 4,
        };
        (class, self.a, self.b.unwrap_or(-1), self.kind as u8)
    }
}

impl fmt::Display for SelfTestProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.b {
            Some(b) => write!(f, "{} {} -> {b}", self.kind.name(), self.a),
            None => write!(f, "{} on rank {}", self.kind.name(), self.a),
        }
    }
}

/// Why a group failed its peer self-test: the problem reported (the first in a fixed order, so
/// every rank reports the same), the devices involved, and every other problem found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfTestFailure {
    pub kind: SelfTestKind,
    /// The rank whose stores or loads failed, or the rank that failed.
    pub a: i32,
    /// The rank whose workspace they went to; None for a problem of rank `a` alone.
    pub b: Option<i32>,
    /// The devices of `a` and `b`, where known (each in its own process's numbering).
    pub device_a: Option<i32>,
    pub device_b: Option<i32>,
    /// Every other problem found, in the same order.
    pub others: Vec<SelfTestProblem>,
    /// What the host saw besides the verdicts (a CUDA error), when it ran the kernels itself.
    pub detail: Option<String>,
    /// For [`SelfTestKind::SlowLink`]: the rate measured (MB/s).
    pub push_mbps: Option<u32>,
}

impl SelfTestFailure {
    /// The problem reported.
    pub fn problem(&self) -> SelfTestProblem {
        SelfTestProblem { kind: self.kind, a: self.a, b: self.b }
    }

    /// Whether a kernel of the test may still run (one did not finish): the memory it may touch
    /// (the workspaces, the result blocks) must never be freed.
    pub fn kernels_may_still_run(&self) -> bool {
        self.kind == SelfTestKind::DidNotFinish || self.others.iter().any(|p| p.kind == SelfTestKind::DidNotFinish)
    }
}

fn device(d: Option<i32>) -> String {
    d.map_or_else(|| "device ?".to_owned(), |d| format!("device {d}"))
}

impl fmt::Display for SelfTestFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, da, db) = (self.a, device(self.device_a), device(self.device_b));
        let b = self.b.unwrap_or(-1);
        write!(f, "the peer self-test failed: ")?;
        match self.kind {
            SelfTestKind::NotRun => write!(
                f,
                "rank {a} ({da}) ran no self-test kernel (it was not launched, its launch failed, or its verdict did not reach the other ranks), so its peers could not check their links with it"
            )?,
            SelfTestKind::Faulted => write!(f, "rank {a}'s self-test kernel ({da}) failed with a CUDA error: an access to a peer's workspace went to a bad address")?,
            SelfTestKind::DidNotFinish => write!(
                f,
                "rank {a}'s self-test kernel ({da}) did not finish: it stalled, most likely on a load from a peer's memory that never returned. It may still run: the group's memory is never freed, and the device needs a reset (or the process's exit) before anything waits for all of its work"
            )?,
            SelfTestKind::MappingFailed => write!(f, "rank {a} -> rank {b} ({da} -> {db}): rank {a} could not map rank {b}'s workspace (mapping failed)")?,
            SelfTestKind::WriteLost => write!(
                f,
                "rank {a} -> rank {b} ({da} -> {db}): rank {a}'s stores into rank {b}'s workspace never arrived within the bound (write lost)"
            )?,
            SelfTestKind::WriteWrong => write!(f, "rank {a} -> rank {b} ({da} -> {db}): rank {a}'s stores arrived garbled in rank {b}'s workspace (write wrong)")?,
            SelfTestKind::ReadWrong => write!(
                f,
                "rank {a} -> rank {b} ({da} reading {db}): rank {a}'s loads from rank {b}'s workspace returned a wrong value (read wrong)"
            )?,
            SelfTestKind::ReadTimedOut => write!(
                f,
                "rank {a} -> rank {b} ({da} reading {db}): rank {a}'s loads from rank {b}'s workspace never returned rank {b}'s value within the bound (read timed out)"
            )?,
            SelfTestKind::SlowLink => write!(
                f,
                "rank {a} -> rank {b} ({da} -> {db}): rank {a}'s stores into rank {b}'s workspace ran at {:.1} GB/s, far below what a PCIe link carries (~25 GB/s at Gen4 x16), so NCCL is faster on these links (slow link)",
                self.push_mbps.unwrap_or(0) as f64 / 1000.0
            )?,
        }
        if !self.others.is_empty() {
            let listed: Vec<String> = self.others.iter().take(6).map(ToString::to_string).collect();
            let more = if self.others.len() > listed.len() { ", ..." } else { "" };
            write!(f, " (and {} more: {}{more})", self.others.len(), listed.join(", "))?;
        }
        if let Some(detail) = &self.detail {
            write!(f, " [{detail}]")?;
        }
        if self.kind == SelfTestKind::NotRun {
            write!(f, ". That is not a fault of the links: that rank's log says why it did not take part")?;
        } else if self.kind == SelfTestKind::SlowLink {
            write!(
                f,
                ". Peer-to-peer writes this slow usually mean the fabric routes them through the CPU: disable PCIe ACS on the switches and root ports between the GPUs (BIOS setting, or setpci), set the IOMMU to passthrough (iommu=pt) or off; `edgellm-allreduce-bench probe --mode peers` measures every pair"
            )?;
        } else {
            write!(
                f,
                ". Peer-to-peer traffic between these GPUs is broken, so the custom all-reduce kernels would hang or compute wrong sums there. Known fixes: disable PCIe ACS on the switches and root ports between the GPUs (BIOS setting, or setpci), set the IOMMU to passthrough (iommu=pt) or off (intel_iommu=off / amd_iommu=off); NCCL_P2P_DISABLE=1 keeps NCCL off the same path"
            )?;
        }
        write!(f, "; EDGELLM_ALLREDUCE_STRATEGY=nccl uses NCCL alone (no custom kernels, no self-test)")
    }
}

impl std::error::Error for SelfTestFailure {}
