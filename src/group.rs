//! One group's memory: the ranks of one communicator that this process drives with the custom
//! kernels, per rank a workspace (staging buffers and barrier slots that peers read and write)
//! and a local state block (call counters that only the kernels advance: CUDA-graph safe),
//! allocated once, zero-filled, freed when the group goes. Sizes follow
//! `kernels/allreduce_params.h` ([`family::workspace_bytes`]). Which devices form a group is
//! `crate::groups`'s business; [`Group::simulated`] puts N ranks on one device for tests and
//! benchmarks.

use crate::contract::{EAR_MAX_BLOCKS, EAR_MAX_RANKS};
use crate::cuda::{self, DeviceBuffer, DevicePtr, IpcMapping};
use crate::error::{Error, Result};
use crate::family::{self, RANK_COUNTS};
use crate::kernels::{self, DeviceKernels};
use std::sync::Arc;

/// The seed's `getMaxRequiredWorkspaceSize`: the largest message the custom kernels take, per
/// rank count (16 MB up to 2 ranks, 8 MB above); `EDGELLM_ALLREDUCE_WORKSPACE_BYTES` overrides.
pub fn max_message_bytes(nranks: i32) -> u64 {
    crate::config().workspace_bytes.unwrap_or(if nranks <= 2 { 16_000_000 } else { 8_000_000 })
}

/// The grid cap: `EDGELLM_ALLREDUCE_MAX_BLOCKS`, else 128 (the kernels' maximum), never more
/// than the SM count of a rank's GPU (all CTAs must be co-resident). On 2 x H200, 128 against 64
/// took the two-shot from 241 to 214 us at 64 MiB and Lamport from 6.5 to 5.7 us at 1 MiB
/// (docs/PERFORMANCE.md).
fn max_blocks(sms: u32) -> u32 {
    crate::config().max_blocks.unwrap_or(EAR_MAX_BLOCKS).clamp(1, EAR_MAX_BLOCKS).min(sms.max(1))
}

/// The grid cap of a rank on `device`.
pub(crate) fn device_max_blocks(device: i32) -> Result<u32> {
    Ok(max_blocks(kernels::for_device(device)?.sm_count.max(1) as u32))
}

/// One rank's memory on its device.
pub(crate) struct Member {
    pub device: i32,
    pub workspace: DeviceBuffer,
    pub state: DeviceBuffer,
    pub kernels: Arc<DeviceKernels>,
}

impl Member {
    /// One rank's workspace and state block on `device` (whose context is current).
    pub fn allocate(device: i32, max_bytes: u64, nranks: i32) -> Result<Member> {
        let kernels = kernels::for_device(device)?;
        kernels.require_all()?;
        let workspace = DeviceBuffer::zeroed(family::workspace_bytes(max_bytes, nranks) as usize)?;
        let state = DeviceBuffer::zeroed(family::state_bytes())?;
        Ok(Member { device, workspace, state, kernels })
    }
}

/// The ranks of one communicator that this process can drive with the custom kernels.
pub struct Group {
    pub nranks: i32,
    /// Largest message (bytes) the workspaces hold.
    pub max_bytes: u64,
    /// Grid cap: identical for every rank (the launch rule).
    pub max_blocks: u32,
    /// Indexed by rank: the ranks this process drives (all of them in-process, one after an
    /// IPC exchange).
    pub(crate) members: Vec<Option<Member>>,
    /// Peers' workspaces mapped from other processes, with the device of the mapping.
    pub(crate) imported: Vec<(i32, IpcMapping)>,
    /// Every rank's workspace as this process addresses it.
    pub(crate) peer_ws: [DevicePtr; EAR_MAX_RANKS],
}

impl Group {
    /// Allocates one workspace per rank, rank `r` on `devices[r]`.
    fn allocate(devices: &[i32], max_bytes: u64, max_blocks: u32) -> Result<Group> {
        let nranks = devices.len() as i32;
        let mut group = Group::empty(nranks, max_bytes, max_blocks)?;
        for (rank, &device) in devices.iter().enumerate() {
            let member = cuda::with_device(device, || Member::allocate(device, max_bytes, nranks))?;
            group.peer_ws[rank] = member.workspace.ptr();
            group.members[rank] = Some(member);
        }
        Ok(group)
    }

    /// A group of `nranks` with no memory yet (the exchange fills it in).
    pub(crate) fn empty(nranks: i32, max_bytes: u64, max_blocks: u32) -> Result<Group> {
        if !RANK_COUNTS.contains(&nranks) {
            return Err(Error::RankCount { nranks, supported: &RANK_COUNTS });
        }
        let members = (0..nranks).map(|_| None).collect();
        Ok(Group { nranks, max_bytes, max_blocks, members, imported: Vec::new(), peer_ws: [DevicePtr::NULL; EAR_MAX_RANKS] })
    }

    /// The ranks of one communicator on distinct devices of this process, with peer access.
    pub fn in_process(devices: &[i32], max_bytes: u64) -> Result<Group> {
        for (i, &a) in devices.iter().enumerate() {
            for &b in &devices[i + 1..] {
                if a == b {
                    return Err(Error::SharedDevice(a));
                }
                if !cuda::enable_peer_access(a, b)? || !cuda::enable_peer_access(b, a)? {
                    return Err(Error::NoPeerAccess(a, b));
                }
            }
        }
        let max_blocks = devices.iter().map(|&d| device_max_blocks(d)).collect::<Result<Vec<_>>>()?;
        Self::allocate(devices, max_bytes, max_blocks.into_iter().min().unwrap_or(1))
    }

    /// `nranks` simulated ranks on one device, for tests and benchmarks. Each rank's grid is
    /// capped at SMs / nranks so that all ranks' CTAs are co-resident (they spin on each other).
    pub fn simulated(device: i32, nranks: i32, max_bytes: u64) -> Result<Group> {
        let sms = kernels::for_device(device)?.sm_count as u32;
        let max_blocks = max_blocks((sms / nranks.max(1) as u32).max(1));
        Self::allocate(&vec![device; nranks.max(0) as usize], max_bytes, max_blocks)
    }

    /// The memory of rank `rank`, if this process drives it.
    pub(crate) fn member(&self, rank: i32) -> Result<&Member> {
        self.members.get(rank as usize).and_then(Option::as_ref).ok_or(Error::RankNotLocal(rank))
    }

    /// The kernels of any rank this process drives (every rank's device loads the same set).
    pub(crate) fn kernels(&self) -> Option<&DeviceKernels> {
        self.members.iter().flatten().next().map(|m| &*m.kernels)
    }
}

impl Drop for Group {
    /// The last Arc is gone: no enqueue can launch on these buffers again. Each mapping and
    /// buffer goes in its device's context (its drop waits for the device's work, then frees).
    fn drop(&mut self) {
        for (device, mapping) in self.imported.drain(..) {
            if let Err(e) = cuda::with_device(device, || {
                drop(mapping);
                Ok(())
            }) {
                crate::log::warning(&format!("unmapping a peer workspace on device {device}: {e}"));
            }
        }
        for member in self.members.drain(..).flatten() {
            let device = member.device;
            if let Err(e) = cuda::with_device(device, || {
                drop(member);
                Ok(())
            }) {
                crate::log::warning(&format!("freeing the workspace on device {device}: {e}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_size_rule() {
        assert_eq!(max_message_bytes(2), 16_000_000);
        assert_eq!(max_message_bytes(8), 8_000_000);
    }

    #[test]
    fn only_rank_counts_with_kernels_form_groups() {
        assert!(matches!(Group::empty(3, 1 << 20, 1), Err(Error::RankCount { nranks: 3, .. })));
        let g = Group::empty(2, 1 << 20, 1).unwrap();
        assert!(matches!(g.member(0), Err(Error::RankNotLocal(0))), "an empty group drives no rank");
        assert!(g.kernels().is_none());
    }
}
