//! Multi-process groups (one rank per process or thread): the IPC exchange and its record.
//!
//! Every rank allocates its workspace, the IPC handles go round through the registered
//! communicator's own NCCL (`ncclAllGather`), each rank maps its peers', and a second gather
//! makes every rank agree: the group forms on all ranks or on none. The first gather also
//! carries everything the ranks must agree on for their kernels to meet (the protocol id, the
//! rank count and order, the host, and every setting that changes which kernel a call runs:
//! [`Settings`]); ranks that differ all use NCCL, each logging the same line that names the
//! difference. A collective: every rank must call it (each from its own thread or process); it
//! blocks until all have. Every rank takes part in all three gathers even after a local failure,
//! so none waits forever ([`exchange`]). The gathers run in the device's setup scratch
//! (`crate::cuda::SetupScratch`: never freed, read after whatever the NCCL queued).

use crate::contract::{EAR_MAX_BLOCKS, EAR_PROTOCOL_ID};
use crate::cuda::{self, IpcMapping};
use crate::error::{Error, Result};
use crate::group::device::{self, Registration};
use crate::group::selftest::{self, RankVerdict, SelfTestInjection, VERDICT_BYTES};
use crate::group::{self, Group, Member};
use crate::launch::strategy::Requested;
use crate::link::{self, LinkClass, PairFacts};
use crate::nccl::communicator::{self, CommInfo};

/// The settings that decide which kernel a call runs, and so must be the same on every rank.
/// (The grid cap may differ: the group takes the smallest. The timeout and PDL act on one rank
/// alone.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `EDGELLM_ALLREDUCE_STRATEGY` (it overrides every plugin's field): 0 unset, else its
    /// `Requested::code`.
    pub strategy: u32,
    /// The largest message the workspaces take (`EDGELLM_ALLREDUCE_WORKSPACE_BYTES`, else the
    /// rule): it decides which calls fit the custom kernels.
    pub max_bytes: u64,
    /// AUTO's tables (`crate::launch::strategy`'s built-in ones with the tuning file's folded in),
    /// hashed: two ranks that choose differently for a size never pair their kernels.
    pub tables: u64,
    /// The tuning file's fingerprint alone (`crate::launch::tuning`; 0: none), to name it when the
    /// tables differ because of it.
    pub tuning: u64,
}

impl Settings {
    /// This process's settings for a communicator of `nranks`.
    pub(crate) fn local(nranks: i32) -> Settings {
        let strategy = Requested::configured().map_or(0, Requested::code);
        let tuning = crate::launch::tuning::active_fingerprint();
        Settings { strategy, max_bytes: group::max_message_bytes(nranks), tables: tables_fingerprint(tuning), tuning }
    }

    fn strategy_name(&self) -> String {
        match Requested::from_code(self.strategy) {
            None => "unset".to_owned(),
            Some(s) => s.name(),
        }
    }
}

/// The fingerprint of every table AUTO may read: the build's ([`crate::launch::strategy::builtin_fingerprint`])
/// with the tuning file's (`tuning`, 0 for none) folded in.
fn tables_fingerprint(tuning: u64) -> u64 {
    let builtin = crate::launch::strategy::builtin_fingerprint();
    if tuning == 0 {
        return builtin;
    }
    crate::launch::tuning::fnv1a(&[builtin.to_le_bytes(), tuning.to_le_bytes()].concat())
}

/// A tuning fingerprint in the log.
fn tuning_name(fingerprint: u64) -> String {
    if fingerprint == 0 {
        "none".to_owned()
    } else {
        format!("{fingerprint:016x}")
    }
}

/// What each rank contributes to the exchange (a fixed little-endian record).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Record {
    ok: bool,
    nranks: i32,
    rank: i32,
    host: u64,
    handle: [u8; 64],
    /// This rank's grid cap; the group takes the smallest.
    max_blocks: u32,
    settings: Settings,
    /// The PCI bus id of the rank's device, NUL-padded: a peer that sees that device (no
    /// `CUDA_VISIBLE_DEVICES` in the way) asks the driver what links them.
    bus: [u8; 16],
}

/// The record's size: fixed for good (the gather needs the same size on every rank, and ranks
/// of builds with another protocol must still read each other's id to reject it). It starts
/// with [`EAR_PROTOCOL_ID`]; the bytes after the last field are zero.
const RECORD_BYTES: usize = 256;

impl Record {
    fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..4].copy_from_slice(&EAR_PROTOCOL_ID.to_le_bytes());
        b[4..8].copy_from_slice(&(self.ok as u32).to_le_bytes());
        b[8..12].copy_from_slice(&self.nranks.to_le_bytes());
        b[12..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..24].copy_from_slice(&self.settings.max_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.host.to_le_bytes());
        b[32..96].copy_from_slice(&self.handle);
        b[96..100].copy_from_slice(&self.max_blocks.to_le_bytes());
        b[100..104].copy_from_slice(&self.settings.strategy.to_le_bytes());
        b[104..112].copy_from_slice(&self.settings.tables.to_le_bytes());
        b[112..120].copy_from_slice(&self.settings.tuning.to_le_bytes());
        b[120..136].copy_from_slice(&self.bus);
        b
    }
    fn decode(b: &[u8]) -> Option<Record> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        (b.len() == RECORD_BYTES && u32_at(0) == EAR_PROTOCOL_ID).then(|| Record {
            ok: u32_at(4) == 1,
            nranks: u32_at(8) as i32,
            rank: u32_at(12) as i32,
            host: u64_at(24),
            handle: b[32..96].try_into().unwrap(),
            max_blocks: u32_at(96),
            settings: Settings {
                strategy: u32_at(100),
                max_bytes: u64_at(16),
                tables: u64_at(104),
                tuning: u64_at(112),
            },
            bus: b[120..136].try_into().unwrap(),
        })
    }
}

/// Whether every rank can join, and the group's grid cap if so; else the first difference, in
/// words. Each record is compared with rank 0's (and the rank count with `nranks`), so every
/// rank, evaluating the same records, reaches the same verdict and logs the same line.
fn agree(records: &[Option<Record>], nranks: i32) -> std::result::Result<u32, String> {
    if records.len() != nranks as usize {
        return Err(format!("{} records for {nranks} ranks", records.len()));
    }
    let Some(first) = records[0] else { return Err(not_ours(0)) };
    for (r, rec) in records.iter().enumerate() {
        let Some(rec) = rec else { return Err(not_ours(r)) };
        let (s, s0) = (rec.settings, first.settings);
        let difference = if rec.nranks != nranks || rec.rank != r as i32 {
            format!("rank {r} reports rank {} of {} ranks", rec.rank, rec.nranks)
        } else if rec.host != first.host {
            format!("rank {r} runs on another host than rank 0: across hosts all-reduce uses NCCL")
        } else if s.strategy != s0.strategy {
            format!("EDGELLM_ALLREDUCE_STRATEGY is {} on rank {r}, {} on rank 0", s.strategy_name(), s0.strategy_name())
        } else if s.max_bytes != s0.max_bytes {
            format!(
                "the workspace takes messages up to {} bytes on rank {r}, {} on rank 0 (EDGELLM_ALLREDUCE_WORKSPACE_BYTES)",
                s.max_bytes, s0.max_bytes
            )
        } else if s.tables != s0.tables && s.tuning != s0.tuning {
            format!(
                "rank {r} chooses kernels by other AUTO tables than rank 0: their tuning files differ (tables {} on rank {r}, {} on rank 0; EDGELLM_ALLREDUCE_TUNING, else edgellm-allreduce-tuning.txt beside the library)",
                tuning_name(s.tuning),
                tuning_name(s0.tuning)
            )
        } else if s.tables != s0.tables {
            format!("rank {r} chooses kernels by other AUTO tables than rank 0 (another build of the library)")
        } else if !(1..=EAR_MAX_BLOCKS).contains(&rec.max_blocks) {
            format!("rank {r} reports a grid cap of {} CTAs", rec.max_blocks)
        } else if !rec.ok {
            format!("rank {r} has no workspace to share (the custom kernels are off there, or it could not allocate or export one)")
        } else {
            continue;
        };
        return Err(difference);
    }
    Ok(records.iter().flatten().map(|r| r.max_blocks).min().unwrap_or(1))
}

fn not_ours(r: usize) -> String {
    format!(
        "rank {r}'s record is not this build's (another kernel protocol than {:?}) or is garbled",
        std::str::from_utf8(&EAR_PROTOCOL_ID.to_be_bytes()).unwrap_or("?")
    )
}

/// FNV-1a of the host name: ranks on different hosts never form a group (multi-node: NCCL).
fn host_id() -> u64 {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most name.len() bytes.
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    name.iter()
        .take_while(|&&c| c != 0)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
}

/// How a rank stands after the first gather and the mapping of its peers' workspaces: what it
/// sends in the second gather.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    /// The records agree and every peer's workspace is mapped here.
    Ready = 1,
    /// The records do not agree (every rank that read them knows why), or it has no workspace.
    Refused = 2,
    /// Its first gather failed.
    GatherFailed = 3,
    /// It could not map a peer's workspace.
    MappingFailed = 4,
}

impl Standing {
    fn from_code(code: u8) -> Option<Standing> {
        [Standing::Ready, Standing::Refused, Standing::GatherFailed, Standing::MappingFailed]
            .into_iter()
            .find(|s| *s as u8 == code)
    }

    /// Why rank `r`, standing so, keeps the group from forming, as its peers say it.
    fn describe(code: u8, r: usize) -> String {
        match Standing::from_code(code) {
            Some(Standing::Ready) => format!("rank {r} is ready"),
            Some(Standing::Refused) => {
                format!("rank {r} refused the group (its records disagree, or it has no workspace)")
            }
            Some(Standing::GatherFailed) => format!("rank {r}'s first gather failed there"),
            Some(Standing::MappingFailed) => format!("rank {r} could not map every workspace"),
            None => format!("rank {r} sent an unknown standing {code}"),
        }
    }
}

/// What a rank sends in the third gather before its verdict.
const NO_SELF_TEST: u8 = 0; // the self-test is off in its process (EDGELLM_ALLREDUCE_SELFTEST_MS=0)
const VERDICT: u8 = 1; // its verdict follows
const STOPPED: u8 = 2; // it ran none: the group was not going to form as it saw the second gather

/// The exchange for `device`, rank `info.rank` of `registration`'s communicator (whose rank
/// count has kernels: the caller checked, as every rank does). `disabled`: the custom kernels
/// are off in this process; it takes part without a workspace, so that every rank uses NCCL.
///
/// Every rank makes the same three gathers, whatever failed on it (a real NCCL's collective
/// that one rank skips never returns on the others): the records, then each rank's standing
/// and links, then the self-test verdicts. A gather that fails on some ranks only after every
/// rank's data went through (an NCCL whose local part failed) can still split the decision at
/// the last gather; the kernels' bounded waits turn that into a fault on the ranks that formed
/// the group, never a hang.
pub(crate) fn exchange(device: i32, registration: &Registration, info: CommInfo, disabled: bool) -> Result<Group> {
    let settings = Settings::local(info.nranks);
    let max_bytes = settings.max_bytes;
    // Before anything else: without it this rank could take part in no gather.
    let scratch = device::setup_scratch(device)?;
    let gather = |bytes: &[u8]| communicator::all_gather(registration, info.nranks, bytes, &scratch);
    device::with_device(device, || {
        crate::group::reclaim::free_released_memory();
        let member = (!disabled).then(|| Member::allocate(device, max_bytes, info.nranks)).and_then(|m| m.ok());
        let handle = member.as_ref().and_then(|m| cuda::ipc_handle(m.workspace.ptr()).ok());
        let mine = Record {
            ok: handle.is_some(),
            nranks: info.nranks,
            rank: info.rank,
            host: host_id(),
            handle: handle.unwrap_or([0; 64]),
            max_blocks: group::device_max_blocks(device).unwrap_or(1),
            settings,
            bus: bus_bytes(&cuda::pci_bus_id(device).unwrap_or_default()),
        };

        // First round: the records.
        let first = gather(&mine.encode());
        // A rank that could not allocate has no group; it still takes part in every gather.
        let mut group = member.as_ref().and_then(|_| Group::empty(info.nranks, max_bytes, 1).ok());
        let (standing, why_here, links_here) = match (&first, &member, &mut group) {
            (Err(e), _, _) => (Standing::GatherFailed, format!("the first gather failed: {e}"), LinkClass::NoPeer),
            (Ok(all), Some(m), Some(group)) => {
                let records: Vec<Option<Record>> = all.chunks_exact(RECORD_BYTES).map(Record::decode).collect();
                match agree(&records, info.nranks) {
                    Err(why) => (Standing::Refused, why, LinkClass::NoPeer),
                    // Every rank sees the same records: the same grid cap everywhere.
                    Ok(max_blocks) => {
                        group.max_blocks = max_blocks;
                        let mapped = map_peers(device, info.rank, &records, m, group);
                        let standing = if mapped { Standing::Ready } else { Standing::MappingFailed };
                        let why = format!("rank {} could not map every workspace", info.rank);
                        (standing, why, links_seen(device, info.rank, &records))
                    }
                }
            }
            // No workspace here: still say why the others will not form a group.
            (Ok(all), _, _) => {
                let records: Vec<Option<Record>> = all.chunks_exact(RECORD_BYTES).map(Record::decode).collect();
                let why = agree(&records, info.nranks).err().unwrap_or_else(|| "no workspace here".to_owned());
                (Standing::Refused, why, LinkClass::NoPeer)
            }
        };
        if let (Some(group), Some(m)) = (&mut group, member) {
            group.members[info.rank as usize] = Some(m); // from here on Drop releases it
        }

        // Second round: everyone learns how everyone stands, and the links each saw (the group
        // takes the worst, the same on every rank).
        let second = gather(&[standing as u8, links_here.code()]);
        let (all_ready, links) = match &second {
            Ok(all) => (
                all.chunks_exact(2).all(|p| p[0] == Standing::Ready as u8),
                all.chunks_exact(2).map(|p| LinkClass::from_code(p[1]).unwrap_or(LinkClass::NoPeer)).max(),
            ),
            Err(_) => (false, None),
        };

        // Third round, always: the peer self-test where every rank stands ready (all ranks that
        // saw the second gather know it alike), each rank's verdict gathered.
        let testing = group.as_ref().filter(|_| first.is_ok() && all_ready);
        let tested = self_test(&gather, info, testing);

        match (first, second, group) {
            (Err(e), _, _) | (_, Err(e), _) => Err(e),
            (Ok(_), Ok(_), Some(mut group)) if all_ready => {
                tested?;
                group.links = links.unwrap_or(LinkClass::NoPeer);
                crate::log::info(&format!(
                    "device {device}: rank {} of {}: links as the ranks saw them: {}",
                    info.rank,
                    info.nranks,
                    describe_class(group.links)
                ));
                Ok(group)
            }
            (_, Ok(all), _) => Err(Error::ExchangeRefused(if standing != Standing::Ready {
                why_here
            } else {
                let (r, p) = all
                    .chunks_exact(2)
                    .enumerate()
                    .find(|(_, p)| p[0] != Standing::Ready as u8)
                    .unwrap_or((0, &[0, 0]));
                Standing::describe(p[0], r)
            })),
        }
    })
}

/// Maps every peer's workspace of `records` into `group` (this rank's own from `member`);
/// false, logged, when one could not be.
fn map_peers(device: i32, rank: i32, records: &[Option<Record>], member: &Member, group: &mut Group) -> bool {
    let mut mapped = true;
    for (r, rec) in records.iter().flatten().enumerate() {
        if r as i32 == rank {
            group.peer_ws[r] = member.workspace.ptr();
            continue;
        }
        match IpcMapping::open(&rec.handle) {
            Ok(mapping) => {
                group.peer_ws[r] = mapping.ptr();
                group.imported.push((device, mapping));
            }
            Err(e) => {
                crate::log::warning(&format!("device {device}: mapping rank {r}'s workspace: {e}"));
                mapped = false;
            }
        }
    }
    mapped
}

/// The third gather: the peer self-test across processes. With `group` (every rank stands
/// ready), this rank runs its kernel (after the second gather, so the ranks start within a
/// gather's skew of each other); every rank then sends what it has (a verdict; none with the test
/// off; or that it stopped before the test) and, with `group`, decides on the same bytes as every
/// other rank: a rank with the test off counts as not run when some rank tested (the group
/// fails); if none tested, there is nothing to decide.
fn self_test(gather: &dyn Fn(&[u8]) -> Result<Vec<u8>>, info: CommInfo, group: Option<&Group>) -> Result<()> {
    // Faults (and a shorter host wait) come only from the test hook
    // (`SelfTestInjection::configured`); each rank applies its own share of the same spec.
    let inject = SelfTestInjection::configured();
    let mut bytes = [0u8; VERDICT_BYTES + 1];
    bytes[0] = match (group, inject.bounds()) {
        (None, _) => STOPPED,
        (Some(_), None) => NO_SELF_TEST,
        (Some(group), Some(bounds)) => {
            let verdict = match group.self_test_rank(info.rank, 1, inject.for_rank(info.rank)) {
                Ok(rank) => selftest::run_one_rank(&rank, bounds),
                Err(_) => RankVerdict::not_run(info.rank, info.nranks, -1),
            };
            bytes[1..].copy_from_slice(&verdict.encode());
            VERDICT
        }
    };
    let all = gather(&bytes)?;
    let Some(group) = group else {
        return Ok(()); // the group is not forming: the earlier gathers said why
    };
    let chunks: Vec<&[u8]> = all.chunks_exact(VERDICT_BYTES + 1).collect();
    if let Some(r) = chunks.iter().position(|c| c[0] == STOPPED) {
        return Err(Error::ExchangeRefused(format!(
            "rank {r} stopped before the peer self-test (its second gather failed there)"
        )));
    }
    if chunks.iter().all(|c| c[0] == NO_SELF_TEST) {
        return Ok(());
    }
    let verdicts: Vec<RankVerdict> = chunks
        .iter()
        .enumerate()
        .map(|(r, c)| {
            if c[0] == VERDICT {
                RankVerdict::decode(&c[1..], r as i32, info.nranks)
            } else {
                RankVerdict::not_run(r as i32, info.nranks, -1)
            }
        })
        .collect();
    selftest::decide(&verdicts).map_err(|failure| {
        if failure.kernels_may_still_run() {
            group.wedge();
        }
        Error::SelfTest(Box::new(failure))
    })
}

/// The worst class of this rank's links to its peers, from the driver where the peer's device
/// is visible in this process (by PCI bus id); a peer it cannot see (`CUDA_VISIBLE_DEVICES`
/// hides it) counts as PCIe: the kernels read the IPC mapping, the self-test checks it, and
/// AUTO takes the tables that never push large messages through peer writes.
fn links_seen(device: i32, rank: i32, records: &[Option<Record>]) -> LinkClass {
    let facts: Vec<PairFacts> = records
        .iter()
        .flatten()
        .enumerate()
        .filter(|&(r, _)| r as i32 != rank)
        .map(|(_, rec)| match ordinal_of_bus(&rec.bus) {
            Some(peer) => link::query(device, peer),
            None => PairFacts { class: LinkClass::Pcie, perf_rank: None, native_atomics: None, access: None },
        })
        .collect();
    link::group_class(&facts)
}

/// The ordinal, in this process, of the device with PCI bus id `bus` (NUL-padded), if visible.
fn ordinal_of_bus(bus: &[u8; 16]) -> Option<i32> {
    let id = std::str::from_utf8(bus).ok()?.trim_end_matches('\0');
    (!id.is_empty()).then_some(())?;
    (0..cuda::device_count().ok()?).find(|&d| cuda::pci_bus_id(d).is_ok_and(|b| b == id))
}

/// `id` NUL-padded into a record's 16 bytes (a longer id, which PCI ids never are, is cut).
fn bus_bytes(id: &str) -> [u8; 16] {
    let mut b = [0u8; 16];
    let n = id.len().min(16);
    b[..n].copy_from_slice(&id.as_bytes()[..n]);
    b
}

/// A class in the log.
fn describe_class(class: LinkClass) -> &'static str {
    match class {
        LinkClass::SameDevice => "one device",
        LinkClass::NvLink => "NVLink",
        LinkClass::Pcie => "PCIe (or not visible from every process)",
        LinkClass::NoPeer => "no peer access",
    }
}

#[cfg(test)]
mod tests;
