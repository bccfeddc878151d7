//! What each rank contributes to the exchange's first gather (its [`Record`]: the settings
//! that decide which kernel a call runs, its workspace's IPC handle, its host and device), and
//! whether the records agree ([`agree`]): every rank evaluates the same records and reaches the
//! same verdict.

use crate::contract::{EAR_MAX_BLOCKS, EAR_PROTOCOL_ID};
use crate::group;
use crate::launch::strategy::Requested;

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

    pub(super) fn strategy_name(&self) -> String {
        match Requested::from_code(self.strategy) {
            None => "unset".to_owned(),
            Some(s) => s.name(),
        }
    }
}

/// The fingerprint of every table AUTO may read: the build's ([`crate::launch::strategy::builtin_fingerprint`])
/// with the tuning file's (`tuning`, 0 for none) folded in.
pub(super) fn tables_fingerprint(tuning: u64) -> u64 {
    let builtin = crate::launch::strategy::builtin_fingerprint();
    if tuning == 0 {
        return builtin;
    }
    crate::fingerprint::fnv1a(&[builtin.to_le_bytes(), tuning.to_le_bytes()].concat())
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
pub(super) struct Record {
    pub(super) ok: bool,
    pub(super) nranks: i32,
    pub(super) rank: i32,
    pub(super) host: u64,
    pub(super) handle: [u8; 64],
    /// This rank's grid cap; the group takes the smallest.
    pub(super) max_blocks: u32,
    pub(super) settings: Settings,
    /// The PCI bus id of the rank's device, NUL-padded: a peer that sees that device (no
    /// `CUDA_VISIBLE_DEVICES` in the way) asks the driver what links them.
    pub(super) bus: [u8; 16],
}

/// The record's size: fixed for good (the gather needs the same size on every rank, and ranks
/// of builds with another protocol must still read each other's id to reject it). It starts
/// with [`EAR_PROTOCOL_ID`]; the bytes after the last field are zero.
pub(super) const RECORD_BYTES: usize = 256;

impl Record {
    pub(super) fn encode(&self) -> [u8; RECORD_BYTES] {
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
    pub(super) fn decode(b: &[u8]) -> Option<Record> {
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
pub(super) fn agree(records: &[Option<Record>], nranks: i32) -> std::result::Result<u32, String> {
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
pub(super) fn host_id() -> u64 {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most name.len() bytes.
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    let len = name.iter().position(|&c| c == 0).unwrap_or(name.len());
    crate::fingerprint::fnv1a(&name[..len])
}

/// `id` NUL-padded into a record's 16 bytes (a longer id, which PCI ids never are, is cut).
pub(super) fn bus_bytes(id: &str) -> [u8; 16] {
    let mut b = [0u8; 16];
    let n = id.len().min(16);
    b[..n].copy_from_slice(&id.as_bytes()[..n]);
    b
}
