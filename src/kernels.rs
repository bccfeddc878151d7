//! The custom all-reduce kernels: embedded fatbins (`kernels/*.cu`, compiled by build.rs),
//! loaded once per device, and the host side of their contract (`kernels/allreduce_params.h`,
//! whose macros `kernels/layout.c` exports so that the layout is defined once).

use crate::cuda::{self, Function};
use crate::error::{Error, Result};
use crate::tensor::DataType;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// `EAR_MAX_RANKS`.
pub const MAX_RANKS: usize = 16;
/// `EAR_BLOCK_THREADS`: every kernel runs with this block size.
pub const BLOCK_THREADS: u32 = 512;
/// `EAR_MAX_BLOCKS`.
pub const MAX_BLOCKS: u32 = 64;
/// Rank counts the kernels are instantiated for.
pub const RANK_COUNTS: [i32; 5] = [2, 4, 6, 8, 16];

/// `EarAllReduceParams`, the kernels' one by-value argument.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AllReduceParams {
    pub peer_ws: [u64; MAX_RANKS],
    pub state: u64,
    pub input: u64,
    pub output: u64,
    pub count: u64,
    pub ws_max_bytes: u64,
    pub rank: i32,
    pub nranks: i32,
}

extern "C" {
    fn ear_workspace_bytes(max_msg_bytes: u64, nranks: i32) -> u64;
    fn ear_lamport_max_msg(max_msg_bytes: u64) -> u64;
    fn ear_grid(work_vecs: u64, max_blocks: u32) -> u32;
    #[allow(dead_code)] // the layout test compares it with AllReduceParams
    fn ear_params_size() -> u64;
    fn ear_state_bytes() -> u32;
}

/// Bytes of one rank's workspace serving messages up to `max_msg_bytes` among `nranks`.
pub fn workspace_bytes(max_msg_bytes: u64, nranks: i32) -> u64 {
    // SAFETY: pure arithmetic on the header's macros.
    unsafe { ear_workspace_bytes(max_msg_bytes, nranks) }
}
/// Largest message the Lamport family takes in a workspace of `max_msg_bytes`.
pub fn lamport_max_bytes(max_msg_bytes: u64) -> u64 {
    // SAFETY: pure arithmetic.
    unsafe { ear_lamport_max_msg(max_msg_bytes) }
}
/// Bytes of one rank's local state block.
pub fn state_bytes() -> usize {
    // SAFETY: returns a constant.
    unsafe { ear_state_bytes() as usize }
}

/// A kernel family: how the reduction moves data between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Every rank stages its input, one barrier, every rank reads all peers and reduces.
    OneShot,
    /// Reduce-scatter then all-gather: two barriers, 2(N-1)/N of the data over the links.
    TwoShot,
    /// Push one-shot whose payload is its own arrival flag: no barrier (small messages).
    Lamport,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::OneShot, Family::TwoShot, Family::Lamport];
    fn prefix(self) -> &'static str {
        match self {
            Family::OneShot => "oneshot",
            Family::TwoShot => "twoshot",
            Family::Lamport => "lamport",
        }
    }
    /// Largest message of this family in a workspace of `max_msg_bytes`.
    pub fn max_bytes(self, max_msg_bytes: u64) -> u64 {
        match self {
            Family::Lamport => lamport_max_bytes(max_msg_bytes),
            _ => max_msg_bytes,
        }
    }
}

fn type_suffix(dtype: DataType) -> &'static str {
    match dtype {
        DataType::Float => "f32",
        DataType::Half => "f16",
        DataType::Bf16 => "bf16",
    }
}

fn kernel_name(family: Family, dtype: DataType, nranks: i32) -> String {
    format!("ear_{}_{}_n{}", family.prefix(), type_suffix(dtype), nranks)
}

/// The kernels of one device (its primary context).
pub struct DeviceKernels {
    functions: HashMap<(Family, DataType, i32), Function>,
    /// Programmatic dependent launch: sm_90 and newer.
    pub pdl: bool,
    pub sm_count: i32,
}

impl DeviceKernels {
    fn load(device: i32) -> Result<Self> {
        let (major, sm_count) = cuda::device_properties(device)?;
        let keys: Vec<(Family, DataType, i32)> = Family::ALL
            .iter()
            .flat_map(|&f| [DataType::Float, DataType::Half, DataType::Bf16].map(move |t| (f, t)))
            .flat_map(|(f, t)| RANK_COUNTS.map(move |n| (f, t, n)))
            .collect();
        let names: Vec<String> = keys.iter().map(|&(f, t, n)| kernel_name(f, t, n)).collect();
        let mut functions = HashMap::new();
        cuda::with_device(device, || {
            for (_, image) in MODULES {
                for (key, found) in keys.iter().zip(cuda::load_module(image, &names)?) {
                    if let Some(f) = found {
                        functions.insert(*key, f);
                    }
                }
            }
            Ok(())
        })?;
        let pdl = major >= 9 && std::env::var("EDGELLM_ALLREDUCE_PDL").map_or(true, |v| v != "0");
        Ok(DeviceKernels { functions, pdl, sm_count })
    }

    pub fn function(&self, family: Family, dtype: DataType, nranks: i32) -> Option<Function> {
        self.functions.get(&(family, dtype, nranks)).copied()
    }

    /// Enqueues one all-reduce of `family` on `stream` (the launch rule of allreduce_params.h:
    /// the grid depends only on the call, so it is identical on every rank).
    ///
    /// # Safety
    /// `params` must describe live workspaces of one group, and buffers of `count` elements on
    /// this device; `stream` must belong to this device's primary context.
    pub unsafe fn launch(
        &self,
        family: Family,
        dtype: DataType,
        params: &AllReduceParams,
        max_blocks: u32,
        stream: usize,
    ) -> Result<()> {
        let f = self
            .function(family, dtype, params.nranks)
            .ok_or_else(|| Error::invalid(format!("no {family:?} kernel for {dtype:?} and {} ranks", params.nranks)))?;
        let vecs = (params.count * dtype.size() as u64).div_ceil(16);
        let work = if family == Family::TwoShot { vecs.div_ceil(params.nranks as u64) } else { vecs };
        let grid = ear_grid(work, max_blocks.clamp(1, MAX_BLOCKS));
        cuda::launch(f, grid, BLOCK_THREADS, stream, params, self.pdl)
    }
}

/// The kernels of `device`, loaded on first use (setup time, never in enqueue's first call:
/// groups load them when they are formed).
pub fn for_device(device: i32) -> Result<Arc<DeviceKernels>> {
    static LOADED: Mutex<Option<HashMap<i32, Arc<DeviceKernels>>>> = Mutex::new(None);
    let mut guard = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(k) = map.get(&device) {
        return Ok(k.clone());
    }
    let k = Arc::new(DeviceKernels::load(device)?);
    map.insert(device, k.clone());
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_match_the_c_header() {
        assert_eq!(std::mem::size_of::<AllReduceParams>() as u64, unsafe { ear_params_size() });
        assert_eq!(std::mem::offset_of!(AllReduceParams, rank), 168);
    }

    #[test]
    fn every_kernel_file_is_embedded() {
        let names: Vec<_> = MODULES.iter().map(|(n, _)| *n).collect();
        for family in ["oneshot", "twoshot", "lamport"] {
            assert!(names.contains(&family), "{family} missing from {names:?}");
        }
        assert!(MODULES.iter().all(|(_, image)| image.len() > 1024), "fatbins are not empty");
    }

    #[test]
    fn workspace_and_grid_rules() {
        let small = workspace_bytes(1 << 20, 2);
        let large = workspace_bytes(16 << 20, 2);
        assert!(small >= 4 << 20 && large > small, "{small} {large}");
        assert!(workspace_bytes(16 << 20, 8) > large, "more ranks, more Lamport rows");
        assert_eq!(lamport_max_bytes(16 << 20), 2 << 20);
        assert_eq!(lamport_max_bytes(1 << 20), 1 << 20);
        assert_eq!(unsafe { ear_grid(1, 32) }, 1);
        assert_eq!(unsafe { ear_grid(512 * 10, 32) }, 10);
        assert_eq!(unsafe { ear_grid(1 << 30, 32) }, 32);
        assert_eq!(kernel_name(Family::Lamport, DataType::Bf16, 8), "ear_lamport_bf16_n8");
        assert!(state_bytes() >= 64);
    }
}
