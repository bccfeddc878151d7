//! Multi-process groups (one rank per process or thread): the IPC exchange and its record.
//!
//! Every rank allocates its workspace, the IPC handles go round through the registered
//! communicator's own NCCL (`ncclAllGather`), each rank maps its peers', and a second gather
//! makes every rank agree: the group forms on all ranks or on none (ranks on other hosts, an IPC
//! failure, different settings or builds: NCCL for all). A collective: every rank must call it
//! (each from its own thread or process); it blocks until all have. Every rank takes part in
//! both gathers even after a local failure, so none waits forever.

use crate::communicator::{self, CommInfo};
use crate::contract::{EAR_MAX_BLOCKS, EAR_PROTOCOL_ID};
use crate::cuda::{self, IpcMapping};
use crate::error::{Error, Result};
use crate::family::RANK_COUNTS;
use crate::group::{self, Group, Member};
use crate::registry::Registration;

/// What each rank contributes to the exchange (a fixed little-endian record).
struct Record {
    ok: bool,
    nranks: i32,
    rank: i32,
    max_bytes: u64,
    host: u64,
    handle: [u8; 64],
    /// This rank's grid cap; the group takes the smallest.
    max_blocks: u32,
}

/// The record starts with [`EAR_PROTOCOL_ID`]: ranks of builds with another kernel protocol
/// reject each other's records.
const RECORD_BYTES: usize = 104;

impl Record {
    fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..4].copy_from_slice(&EAR_PROTOCOL_ID.to_le_bytes());
        b[4..8].copy_from_slice(&(self.ok as u32).to_le_bytes());
        b[8..12].copy_from_slice(&self.nranks.to_le_bytes());
        b[12..16].copy_from_slice(&self.rank.to_le_bytes());
        b[16..24].copy_from_slice(&self.max_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.host.to_le_bytes());
        b[32..96].copy_from_slice(&self.handle);
        b[96..100].copy_from_slice(&self.max_blocks.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Option<Record> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        (b.len() == RECORD_BYTES && u32_at(0) == EAR_PROTOCOL_ID).then(|| Record {
            ok: u32_at(4) == 1,
            nranks: u32_at(8) as i32,
            rank: u32_at(12) as i32,
            max_bytes: u64_at(16),
            host: u64_at(24),
            handle: b[32..96].try_into().unwrap(),
            max_blocks: u32_at(96),
        })
    }
}

/// Whether every rank can join: each record valid and ready, in rank order, with this rank's
/// rank count, workspace size and host. Every rank evaluates the same records, so all agree.
fn agree(records: &[Option<Record>], mine: &Record) -> bool {
    records.len() == mine.nranks as usize
        && records.iter().enumerate().all(|(r, rec)| {
            rec.as_ref().is_some_and(|rec| {
                rec.ok
                    && rec.nranks == mine.nranks
                    && rec.rank == r as i32
                    && rec.max_bytes == mine.max_bytes
                    && rec.host == mine.host
                    && (1..=EAR_MAX_BLOCKS).contains(&rec.max_blocks)
            })
        })
}

/// FNV-1a of the host name: ranks on different hosts never form a group (multi-node: NCCL).
fn host_id() -> u64 {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most name.len() bytes.
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    name.iter().take_while(|&&c| c != 0).fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3))
}

/// The exchange for `device`, rank `info.rank` of `registration`'s communicator.
pub(crate) fn exchange(device: i32, registration: &Registration, info: CommInfo) -> Result<Group> {
    let max_bytes = group::max_message_bytes(info.nranks);
    cuda::with_device(device, || {
        let member = RANK_COUNTS.contains(&info.nranks).then(|| Member::allocate(device, max_bytes, info.nranks)).and_then(|m| m.ok());
        let handle = member.as_ref().and_then(|m| cuda::ipc_handle(m.workspace.ptr()).ok());
        let mine = Record {
            ok: handle.is_some(),
            nranks: info.nranks,
            rank: info.rank,
            max_bytes,
            host: host_id(),
            handle: handle.unwrap_or([0; 64]),
            max_blocks: group::device_max_blocks(device).unwrap_or(1),
        };
        let gathered = communicator::all_gather(registration, info.nranks, &mine.encode());
        // A rank that could not allocate has no group; it still takes part in both gathers.
        let mut group = member.as_ref().and_then(|_| Group::empty(info.nranks, max_bytes, 1).ok());
        let mut mapped_all = false;
        if let (Ok(all), Some(m), Some(group)) = (&gathered, &member, &mut group) {
            let records: Vec<Option<Record>> = all.chunks_exact(RECORD_BYTES).map(Record::decode).collect();
            if agree(&records, &mine) {
                mapped_all = true;
                // Every rank sees the same records: the same grid cap everywhere.
                group.max_blocks = records.iter().flatten().map(|r| r.max_blocks).min().unwrap_or(1);
                for (r, rec) in records.iter().flatten().enumerate() {
                    if r as i32 == info.rank {
                        group.peer_ws[r] = m.workspace.ptr();
                        continue;
                    }
                    match IpcMapping::open(&rec.handle) {
                        Ok(mapping) => {
                            group.peer_ws[r] = mapping.ptr();
                            group.imported.push((device, mapping));
                        }
                        Err(e) => {
                            crate::log::warning(&format!("device {device}: mapping rank {r}'s workspace: {e}"));
                            mapped_all = false;
                        }
                    }
                }
            }
        }
        // Second round: everyone learns whether everyone mapped everything.
        let verdict = communicator::all_gather(registration, info.nranks, &[mapped_all as u8]);
        if let (Some(group), Some(m)) = (&mut group, member) {
            group.members[info.rank as usize] = Some(m); // from here on Drop releases it
        }
        match (gathered, verdict, group) {
            (Ok(_), Ok(flags), Some(group)) if flags.iter().all(|&f| f == 1) => Ok(group),
            (Err(e), _, _) | (_, Err(e), _) => Err(e),
            _ => Err(Error::ExchangeRefused),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(rank: i32) -> Record {
        Record { ok: true, nranks: 2, rank, max_bytes: 16_000_000, host: host_id(), handle: [rank as u8; 64], max_blocks: 128 - rank as u32 }
    }
    fn round_trip(r: &Record) -> Option<Record> {
        Record::decode(&r.encode())
    }

    #[test]
    fn exchange_records_round_trip() {
        let r = round_trip(&record(1)).unwrap();
        assert_eq!((r.ok, r.nranks, r.rank, r.max_bytes, r.host, r.handle, r.max_blocks), (true, 2, 1, 16_000_000, host_id(), [1; 64], 127));
        assert!(Record::decode(&[0u8; RECORD_BYTES]).is_none(), "no magic, no record");
        assert!(Record::decode(&[0u8; 8]).is_none());
        let mut older = record(1).encode();
        older[0..4].copy_from_slice(&0x4541_5234u32.to_le_bytes()); // "EAR4": a polled two-shot at 4+ ranks
        assert!(Record::decode(&older).is_none(), "a build with the previous kernel protocol");
    }

    #[test]
    fn all_ranks_join_or_none() {
        let mine = record(0);
        let all = |f: &dyn Fn(&mut Record)| {
            (0..2)
                .map(|r| {
                    let mut rec = record(r);
                    if r == 1 {
                        f(&mut rec);
                    }
                    round_trip(&rec)
                })
                .collect::<Vec<_>>()
        };
        assert!(agree(&all(&|_| {}), &mine));
        assert!(!agree(&all(&|r| r.ok = false), &mine), "a rank that could not allocate");
        assert!(!agree(&all(&|r| r.host ^= 1), &mine), "a rank on another host: multi-node uses NCCL");
        assert!(!agree(&all(&|r| r.max_bytes = 8_000_000), &mine), "different workspace settings");
        assert!(!agree(&all(&|r| r.rank = 0), &mine), "ranks out of order");
        assert!(!agree(&all(&|r| r.nranks = 4), &mine));
        assert!(agree(&all(&|r| r.max_blocks = 66), &mine), "grid caps may differ: the group takes the smallest");
        assert!(!agree(&all(&|r| r.max_blocks = 0), &mine), "a grid cap out of range");
        assert!(!agree(&all(&|r| r.max_blocks = EAR_MAX_BLOCKS + 1), &mine));
        assert!(!agree(&[round_trip(&mine), None], &mine), "a garbled record");
        assert!(!agree(&[round_trip(&mine)], &mine), "a missing rank");
    }
}
