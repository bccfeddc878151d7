//! One rank's verdict, its bytes in the gather, and the decision every rank takes alike from
//! all of them.

use super::*;

/// How one rank's kernel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankState {
    /// It ended and reported every entry.
    Finished = 1,
    /// It had not ended at the host's deadline (it stalled: a peer load that never returns).
    Unfinished = 2,
    /// It ended with a CUDA error (an access to a bad address: a broken mapping).
    Faulted = 3,
    /// No kernel ran (not launched, its launch failed), or its verdict did not arrive.
    NotRun = 4,
}

impl RankState {
    fn from_code(code: u32) -> RankState {
        match code {
            1 => RankState::Finished,
            2 => RankState::Unfinished,
            3 => RankState::Faulted,
            _ => RankState::NotRun,
        }
    }
}

/// One rank's verdict: how its kernel ended and what it saw of each peer, compact enough to be
/// gathered by every rank ([`RankVerdict::encode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankVerdict {
    pub rank: i32,
    pub nranks: i32,
    /// The rank's device (in its own process's numbering).
    pub device: i32,
    pub state: RankState,
    /// `write[q]`: how rank q's token arrived in this rank's workspace (`EAR_SELFTEST_*`).
    pub write: [u8; EAR_MAX_RANKS],
    /// `read[q]`: what this rank's loads of rank q's workspace returned (`EAR_SELFTEST_*`).
    pub read: [u8; EAR_MAX_RANKS],
    /// How long the kernel took (ns, its own clock); 0 unless finished.
    pub elapsed_ns: u64,
    /// The bandwidth check's rate into the next rank (MB/s); 0: not measured.
    pub push_mbps: u32,
}

/// The size of an encoded [`RankVerdict`]: what each rank contributes to the gather.
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub const VERDICT_BYTES: usize = 64;

impl RankVerdict {
    /// The verdict of a rank that ran no kernel (or whose verdict did not arrive).
    pub fn not_run(rank: i32, nranks: i32, device: i32) -> RankVerdict {
        RankVerdict {
            rank,
            nranks,
            device,
            state: RankState::NotRun,
            write: [0; EAR_MAX_RANKS],
            read: [0; EAR_MAX_RANKS],
            elapsed_ns: 0,
            push_mbps: 0,
        }
    }

    /// Little-endian: the magic, rank, rank count, device, state, the push rate, the time, then
    /// the write and read entries.
    pub fn encode(&self) -> [u8; VERDICT_BYTES] {
        let mut b = [0u8; VERDICT_BYTES];
        b[0..4].copy_from_slice(&EAR_SELFTEST_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.rank.to_le_bytes());
        b[8..12].copy_from_slice(&self.nranks.to_le_bytes());
        b[12..16].copy_from_slice(&self.device.to_le_bytes());
        b[16..20].copy_from_slice(&(self.state as u32).to_le_bytes());
        b[20..24].copy_from_slice(&self.push_mbps.to_le_bytes());
        b[24..32].copy_from_slice(&self.elapsed_ns.to_le_bytes());
        b[32..48].copy_from_slice(&self.write);
        b[48..64].copy_from_slice(&self.read);
        b
    }

    /// Rank `rank`'s gathered verdict: [`RankState::NotRun`] (device -1) unless `bytes` is one,
    /// of that rank and rank count.
    pub fn decode(bytes: &[u8], rank: i32, nranks: i32) -> RankVerdict {
        let absent = RankVerdict::not_run(rank, nranks, -1);
        if bytes.len() != VERDICT_BYTES {
            return absent;
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let i32_at = |i: usize| u32_at(i) as i32;
        if u32_at(0) != EAR_SELFTEST_MAGIC || i32_at(4) != rank || i32_at(8) != nranks {
            return absent;
        }
        RankVerdict {
            rank,
            nranks,
            device: i32_at(12),
            state: RankState::from_code(u32_at(16)),
            write: bytes[32..48].try_into().unwrap(),
            read: bytes[48..64].try_into().unwrap(),
            elapsed_ns: u64::from_le_bytes(bytes[24..32].try_into().unwrap()),
            push_mbps: u32_at(20),
        }
    }
}

/// The decision on every rank's verdict (index = rank), the same on every rank that runs it on
/// the same verdicts: Ok when every rank finished and every write and read between every pair
/// passed; else the first problem in [`SelfTestProblem::order`], with all the others. A verdict
/// that is not of its index's rank or of the list's rank count counts as not run. The failures
/// between two ranks are judged only when both finished (else the rank's own problem explains
/// them).
#[cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]
pub fn decide(verdicts: &[RankVerdict]) -> std::result::Result<(), SelfTestFailure> {
    decide_with(verdicts, MIN_PUSH_MBPS)
}

/// [`decide`], a push rate below `min_push_mbps` (MB/s, identical on every rank) also failing
/// the group ([`SelfTestKind::SlowLink`]).
pub(crate) fn decide_with(verdicts: &[RankVerdict], min_push_mbps: u32) -> std::result::Result<(), SelfTestFailure> {
    let n = verdicts.len();
    let state = |r: usize| {
        let v = &verdicts[r];
        if v.rank == r as i32 && v.nranks == n as i32 {
            v.state
        } else {
            RankState::NotRun
        }
    };
    let mut problems = Vec::new();
    for a in 0..n {
        let kind = match state(a) {
            RankState::Finished => continue,
            RankState::Unfinished => SelfTestKind::DidNotFinish,
            RankState::Faulted => SelfTestKind::Faulted,
            RankState::NotRun => SelfTestKind::NotRun,
        };
        problems.push(SelfTestProblem { kind, a: a as i32, b: None });
    }
    for a in (0..n).filter(|&a| state(a) == RankState::Finished) {
        for b in (0..n).filter(|&b| b != a && state(b) == RankState::Finished) {
            // NOT_SEEN, and whatever else a finished kernel should not have left (PENDING), fail.
            let write = match verdicts[b].write.get(a).map(|&s| s as u32) {
                Some(EAR_SELFTEST_PASSED) => None,
                Some(EAR_SELFTEST_WRONG) => Some(SelfTestKind::WriteWrong),
                _ => Some(SelfTestKind::WriteLost),
            };
            let read = match verdicts[a].read.get(b).map(|&s| s as u32) {
                Some(EAR_SELFTEST_PASSED | EAR_SELFTEST_SKIPPED) => None,
                Some(EAR_SELFTEST_WRONG) => Some(SelfTestKind::ReadWrong),
                Some(EAR_SELFTEST_UNMAPPED) => Some(SelfTestKind::MappingFailed),
                _ => Some(SelfTestKind::ReadTimedOut),
            };
            problems.extend([write, read].into_iter().flatten().map(|kind| SelfTestProblem {
                kind,
                a: a as i32,
                b: Some(b as i32),
            }));
        }
    }
    // The bandwidth checks, of ranks whose tokens went through (a lost write explains itself).
    let slow = (0..n)
        .filter(|&a| state(a) == RankState::Finished)
        .filter(|&a| (1..min_push_mbps).contains(&verdicts[a].push_mbps))
        .map(|a| (a, verdicts[a].push_mbps))
        .min_by_key(|&(_, mbps)| mbps);
    if let Some((a, _)) = slow.filter(|_| problems.is_empty()) {
        problems.push(SelfTestProblem { kind: SelfTestKind::SlowLink, a: a as i32, b: Some(((a + 1) % n) as i32) });
    }
    problems.sort_by_key(SelfTestProblem::order);
    let mut problems = problems.into_iter();
    let Some(first) = problems.next() else {
        return Ok(());
    };
    let device = |r: i32| {
        let v = verdicts.get(usize::try_from(r).ok()?)?;
        (v.device >= 0 && v.state != RankState::NotRun).then_some(v.device)
    };
    Err(SelfTestFailure {
        kind: first.kind,
        a: first.a,
        b: first.b,
        device_a: device(first.a),
        device_b: first.b.and_then(device),
        others: problems.collect(),
        detail: None,
        push_mbps: slow.map(|(_, mbps)| mbps).filter(|_| first.kind == SelfTestKind::SlowLink),
    })
}
