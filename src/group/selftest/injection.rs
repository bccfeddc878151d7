//! Fault injection for the tests, and the group's entry points to the test (in one process, or
//! rank by rank as processes of their own run it).

use super::*;
use crate::config::MAX_SELFTEST_MS;
use crate::contract::{EAR_MAX_RANKS, EAR_SELFTEST_PUSH_BYTES};
use crate::launch::Fits;
use crate::link::LinkClass;

/// Fault injection for [`Group::self_test`] (tests only; `Default`: none, the configured bound).
#[doc(hidden)]
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SelfTestInjection {
    /// `(from, to)`: rank `from` does not write its token into rank `to`'s workspace.
    pub drop_writes: Vec<(i32, i32)>,
    /// `(from, to)`: rank `from` writes a wrong token into rank `to`'s workspace.
    pub garble_writes: Vec<(i32, i32)>,
    /// Ranks that write a wrong token into their own slot (every peer reads a wrong value).
    pub garble_own_slot: Vec<i32>,
    /// Ranks whose kernel is never launched.
    pub not_launched: Vec<i32>,
    /// The kernels' bound instead of `EDGELLM_ALLREDUCE_SELFTEST_MS`.
    pub bound: Option<Duration>,
    /// How long the host waits for the kernels in all (from before the first launch) instead of
    /// the bound plus [`HOST_GRACE`]: longer under compute-sanitizer, which is slow to start
    /// kernels; shorter than the bound to see how a kernel that does not finish is handled.
    pub host_wait: Option<Duration>,
    /// Whether the read path is probed, instead of the group's own answer (`Group::pulls`): a
    /// test that a group without pulling families never loads from its peers.
    pub probe_reads: Option<bool>,
    /// Whether the bandwidth check runs, instead of the group's answer (separate GPUs: yes; one
    /// device: no).
    pub measure_push: Option<bool>,
    /// The slowest push taken instead of [`MIN_PUSH_MBPS`] (in-process groups).
    pub min_push_mbps: Option<u32>,
}

impl SelfTestInjection {
    /// The faults of the test hook `EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT` (`crate::config`),
    /// with a warning while any is set (never a user setting); none when it is unset, and none
    /// with one warning when it is not a fault spec ([`SelfTestInjection::parse`]).
    pub(crate) fn configured() -> SelfTestInjection {
        let Some(spec) = crate::config::get().selftest_fault.as_deref() else {
            return SelfTestInjection::default();
        };
        match SelfTestInjection::parse(spec) {
            Ok(inject) => {
                crate::log::warning(&format!(
                    "EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT (a test hook): the peer self-test runs with faults injected: {inject:?}"
                ));
                inject
            }
            Err(why) => {
                crate::log::warning(&format!(
                    "EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT={spec} is not a fault spec ({why}): ignored"
                ));
                SelfTestInjection::default()
            }
        }
    }

    /// Parses the hook's comma-separated list of `drop:A>B`, `garble:A>B`, `garble-slot:R`,
    /// `not-launched:R` (ranks below `EAR_MAX_RANKS`, A != B), `host-wait:MS`, `reads:on|off`,
    /// `push:on|off`; Err says what is wrong.
    pub(crate) fn parse(spec: &str) -> std::result::Result<SelfTestInjection, String> {
        let rank = |v: &str| -> std::result::Result<i32, String> {
            v.trim()
                .parse::<i32>()
                .ok()
                .filter(|r| (0..EAR_MAX_RANKS as i32).contains(r))
                .ok_or_else(|| format!("'{}' is not a rank from 0 to {}", v.trim(), EAR_MAX_RANKS - 1))
        };
        let pair = |v: &str| -> std::result::Result<(i32, i32), String> {
            let (a, b) = v.split_once('>').ok_or_else(|| format!("'{}' is not a pair FROM>TO", v.trim()))?;
            let (a, b) = (rank(a)?, rank(b)?);
            if a == b {
                return Err(format!("{a}>{b}: a rank's own slot is garble-slot:{a}"));
            }
            Ok((a, b))
        };
        let mut inject = SelfTestInjection::default();
        for item in spec.split(',') {
            let (kind, value) = item.split_once(':').unwrap_or((item, ""));
            match kind.trim() {
                "drop" => inject.drop_writes.push(pair(value)?),
                "garble" => inject.garble_writes.push(pair(value)?),
                "garble-slot" => inject.garble_own_slot.push(rank(value)?),
                "not-launched" => inject.not_launched.push(rank(value)?),
                "reads" => inject.probe_reads = Some(on_off(value)?),
                "push" => inject.measure_push = Some(on_off(value)?),
                "host-wait" => {
                    let ms = value.trim().parse::<u64>().ok().filter(|ms| *ms <= MAX_SELFTEST_MS);
                    let ms = ms.ok_or_else(|| {
                        format!("'{}' is not a wait in milliseconds up to {MAX_SELFTEST_MS}", value.trim())
                    })?;
                    inject.host_wait = Some(Duration::from_millis(ms));
                }
                other => {
                    return Err(format!(
                        "'{other}' is not drop:A>B, garble:A>B, garble-slot:R, not-launched:R, host-wait:MS, reads:on|off or push:on|off"
                    ));
                }
            }
        }
        Ok(inject)
    }

    pub(crate) fn for_rank(&self, rank: i32) -> RankInjection {
        let mask = |pairs: &[(i32, i32)]| {
            pairs
                .iter()
                .filter(|&&(from, _)| from == rank)
                .fold(0u32, |m, &(_, to)| m | 1u32.checked_shl(to as u32).unwrap_or(0))
        };
        let own = if self.garble_own_slot.contains(&rank) { 1u32.checked_shl(rank as u32).unwrap_or(0) } else { 0 };
        RankInjection {
            skip_mask: mask(&self.drop_writes),
            garble_mask: mask(&self.garble_writes) | own,
            not_launched: self.not_launched.contains(&rank),
            probe_reads: self.probe_reads,
            measure_push: self.measure_push,
        }
    }

    /// The bounds to run with; None: the configured bound is 0 (no self-test).
    pub(crate) fn bounds(&self) -> Option<Bounds> {
        let bounds = self.bound.map(Bounds::new).or_else(Bounds::configured)?;
        Some(Bounds { host: self.host_wait.unwrap_or(bounds.host), ..bounds })
    }
}

impl Group {
    /// Rank `rank`'s part of self-test round `round` (this process must drive the rank): its
    /// device, its kernel, the workspaces as this process maps them (NULL where a mapping
    /// failed). For a group formed by the exchange: `round` 1, the same on every rank.
    pub(crate) fn self_test_rank(&self, rank: i32, round: u32, inject: RankInjection) -> Result<RankSelfTest> {
        let member = self.member(rank)?;
        let function = member
            .kernels
            .selftest()
            .ok_or_else(|| Error::NoKernel(crate::launch::kernels::SELFTEST_KERNEL.to_owned()))?;
        let (function, push_function) = function;
        // Ranks on one device have no link to time (their group's `links` is only what the
        // driver said of separate devices): the link class, as the planner sees it.
        let measure =
            inject.measure_push.unwrap_or(matches!(Fits::link_class(self), LinkClass::NvLink | LinkClass::Pcie));
        let push = measure.then(|| self.push_check(rank, push_function)).flatten();
        Ok(RankSelfTest {
            rank,
            nranks: self.nranks,
            device: member.device,
            function,
            push,
            peer_ws: self.peer_ws,
            max_bytes: self.max_bytes,
            round,
            probe_reads: inject.probe_reads.unwrap_or(self.pulls),
            inject,
        })
    }

    /// Rank `rank`'s bandwidth check: `EAR_SELFTEST_PUSH_BYTES` (at most a one-shot bank) from
    /// its bank 1 into the next rank's bank 0; None without that rank's mapping, or where a bank
    /// is too small to time (a workspace of a few KiB).
    fn push_check(&self, rank: i32, function: Function) -> Option<PushCheck> {
        let next = ((rank + 1) % self.nranks.max(1)) as usize;
        let (dst, src) = (self.peer_ws[next], self.peer_ws[rank as usize]);
        // SAFETY: pure arithmetic on the header's macros.
        let (bank0, bank1, bank) = unsafe {
            (
                ear_oneshot_bank_offset(self.max_bytes, self.nranks, 0),
                ear_oneshot_bank_offset(self.max_bytes, self.nranks, 1),
                ear_oneshot_bank_bytes(self.max_bytes),
            )
        };
        let bytes = EAR_SELFTEST_PUSH_BYTES.min(bank) / 16 * 16;
        (next as i32 != rank && dst != DevicePtr::NULL && bytes >= 64 << 10).then(|| PushCheck {
            function,
            dst: dst.offset(bank0),
            src: src.offset(bank1),
            bytes,
        })
    }

    /// Every rank's part of a new self-test round of this group, whose ranks must all be in
    /// this process (an in-process or simulated group).
    fn self_test_ranks(&self, inject: &SelfTestInjection) -> Result<Vec<RankSelfTest>> {
        let round = self.next_self_test_round();
        (0..self.nranks).map(|rank| self.self_test_rank(rank, round, inject.for_rank(rank))).collect()
    }

    /// Runs the peer self-test on every rank of this group (all in this process: an in-process
    /// or simulated group): one kernel per rank, all at once, each on a new stream of its device,
    /// bounded by `EDGELLM_ALLREDUCE_SELFTEST_MS` (Ok at once when it is 0) or `inject.bound`.
    /// [`Error::SelfTest`] names the first problem. A group whose test left a kernel running is
    /// retired and never freed.
    pub fn self_test(&self, inject: &SelfTestInjection) -> Result<()> {
        let Some(bounds) = inject.bounds() else {
            return Ok(());
        };
        let ranks = self.self_test_ranks(inject)?;
        run_in_process(&ranks, bounds, inject.min_push_mbps.unwrap_or(MIN_PUSH_MBPS)).map_err(|failure| {
            if failure.kernels_may_still_run() {
                self.wedge();
            }
            Error::SelfTest(Box::new(failure))
        })
    }

    /// The self-test as ranks in processes of their own run it (tests): each rank's
    /// [`run_one_rank`] on a thread of its own, all at once; then the "gather": every verdict
    /// encoded and decoded, a rank that was not launched contributing nothing (it decodes as
    /// not run). Returns the verdicts in rank order, for [`decide`].
    #[doc(hidden)]
    pub fn self_test_each_rank(&self, inject: &SelfTestInjection) -> Result<Vec<RankVerdict>> {
        let bounds = inject.bounds().unwrap_or(Bounds::new(Duration::from_millis(crate::config::DEFAULT_SELFTEST_MS)));
        let ranks = self.self_test_ranks(inject)?;
        let gathered: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let threads: Vec<_> = ranks
                .iter()
                .map(|rank| {
                    scope.spawn(move || {
                        if rank.inject.not_launched {
                            Vec::new()
                        } else {
                            run_one_rank(rank, bounds).encode().to_vec()
                        }
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap_or_default()).collect()
        });
        let verdicts: Vec<RankVerdict> =
            gathered.iter().zip(0..).map(|(bytes, rank)| RankVerdict::decode(bytes, rank, self.nranks)).collect();
        if verdicts.iter().any(|v| v.state == RankState::Unfinished) {
            self.wedge();
        }
        Ok(verdicts)
    }
}

/// `"on"` or `"off"` of a fault spec.
fn on_off(value: &str) -> std::result::Result<bool, String> {
    match value.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("'{other}' is not on or off")),
    }
}

// kernels/layout.c.
extern "C" {
    fn ear_oneshot_bank_offset(max_msg_bytes: u64, nranks: i32, bank: u32) -> u64;
    fn ear_oneshot_bank_bytes(max_msg_bytes: u64) -> u64;
}
