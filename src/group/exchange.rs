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

use crate::cuda::{self, IpcMapping};
use crate::error::{Error, Result};
use crate::group::device::{self, Registration};
use crate::group::selftest::{self, RankVerdict, SelfTestInjection, VERDICT_BYTES};
use crate::group::{self, Group, Member};
use crate::launch::strategy::pulls_enabled;
use crate::link::{self, LinkClass, PairFacts};
use crate::nccl::communicator::{self, CommInfo};

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
        let no_links = || (LinkClass::NoPeer, false);
        let (standing, why_here, (links_here, reads_here)) = match (&first, &member, &mut group) {
            (Err(e), _, _) => (Standing::GatherFailed, format!("the first gather failed: {e}"), no_links()),
            (Ok(all), Some(m), Some(group)) => {
                let records: Vec<Option<Record>> = all.chunks_exact(RECORD_BYTES).map(Record::decode).collect();
                match agree(&records, info.nranks) {
                    Err(why) => (Standing::Refused, why, no_links()),
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
                (Standing::Refused, why, no_links())
            }
        };
        if let (Some(group), Some(m)) = (&mut group, member) {
            group.members[info.rank as usize] = Some(m); // from here on Drop releases it
        }

        // Second round: everyone learns how everyone stands, the links each saw and whether it
        // saw peer reads supported (the group takes the worst, the same on every rank).
        let second = gather(&[standing as u8, links_here.code(), reads_here as u8]);
        let (all_ready, links, reads) = match &second {
            Ok(all) => (
                all.chunks_exact(3).all(|p| p[0] == Standing::Ready as u8),
                all.chunks_exact(3).map(|p| LinkClass::from_code(p[1]).unwrap_or(LinkClass::NoPeer)).max(),
                all.chunks_exact(3).all(|p| p[2] == 1),
            ),
            Err(_) => (false, None, false),
        };
        if let Some(group) = &mut group {
            // What the self-test probes and the strategy allows follow from the links alike on
            // every rank.
            group.links = links.unwrap_or(LinkClass::NoPeer);
            group.pulls = reads && pulls_enabled(group.links, info.nranks, crate::launch::tuning::active());
        }

        // Third round, always: the peer self-test where every rank stands ready (all ranks that
        // saw the second gather know it alike), each rank's verdict gathered.
        let testing = group.as_ref().filter(|_| first.is_ok() && all_ready);
        let tested = self_test(&gather, info, testing);

        match (first, second, group) {
            (Err(e), _, _) | (_, Err(e), _) => Err(e),
            (Ok(_), Ok(_), Some(group)) if all_ready => {
                tested?;
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
                    .chunks_exact(3)
                    .enumerate()
                    .find(|(_, p)| p[0] != Standing::Ready as u8)
                    .unwrap_or((0, &[0, 0, 0]));
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

/// The worst class of this rank's links to its peers, and whether peer reads are supported on
/// all of them (NVML), from the driver where the peer's device is visible in this process (by
/// PCI bus id); a peer it cannot see (`CUDA_VISIBLE_DEVICES` hides it) counts as PCIe (the
/// cautious tables), with what NVML says of it.
fn links_seen(device: i32, rank: i32, records: &[Option<Record>]) -> (LinkClass, bool) {
    let mine = cuda::pci_bus_id(device).unwrap_or_default();
    let facts: Vec<PairFacts> = records
        .iter()
        .flatten()
        .enumerate()
        .filter(|&(r, _)| r as i32 != rank)
        .map(|(_, rec)| match ordinal_of_bus(&rec.bus) {
            Some(peer) => link::query(device, peer),
            // NVML knows every GPU of the machine, CUDA_VISIBLE_DEVICES or not.
            None => PairFacts::new(false, Some(true), None, None).with_p2p(crate::nvml::p2p(&mine, bus_text(&rec.bus))),
        })
        .collect();
    (link::group_class(&facts), link::reads_supported(&facts))
}

/// A record's bus id as text (NUL padding cut).
fn bus_text(bus: &[u8; 16]) -> &str {
    std::str::from_utf8(bus).unwrap_or("").trim_end_matches('\0')
}

/// The ordinal, in this process, of the device with PCI bus id `bus` (NUL-padded), if visible.
fn ordinal_of_bus(bus: &[u8; 16]) -> Option<i32> {
    let id = bus_text(bus);
    (!id.is_empty()).then_some(())?;
    (0..cuda::device_count().ok()?).find(|&d| cuda::pci_bus_id(d).is_ok_and(|b| b == id))
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

mod record;

use record::*;

#[cfg(test)]
mod tests;
